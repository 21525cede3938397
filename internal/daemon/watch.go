package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kfile"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// watcher runs the core's two periodic checks on its running sandboxes:
// expiry (every second, the expiry action of each sandbox past its expiry
// and its lease) and the PID-1 watch (every two seconds, a running sandbox
// whose init process died fails; an OOM kill inside one becomes an event).
// It reaches the core through watchCore only. Its one piece of state, the
// OOM counters, belongs to the watch loop's goroutine (no lock).
type watcher struct {
	c    watchCore
	ooms map[string]uint64 // sandbox id → OOM kills seen (watchLoop only)
	// inits are runc sandboxes' PID 1 as last confirmed running by the
	// runtime (watchLoop only): while that very process lives the watch
	// asks its pidfd instead of starting a `runc state` per sandbox every
	// 2 s, which at 1,000 idle sandboxes was more CPU than the host has.
	inits map[string]hostProc
}

// watchCore is what the watcher needs of the core: primitives and the
// three actions an expiry or a dead PID 1 takes.
type watchCore interface {
	Store() store.Store
	Log() *slog.Logger
	Now() time.Time
	Lock(id string) func()
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)

	// ExpireDelete, ExpirePause and ExpireStop apply an expiry action, as
	// admin, with actor "expiry" and reason "expired".
	ExpireDelete(ctx context.Context, id string) error
	ExpirePause(ctx context.Context, sb *sandbox.Sandbox) error
	ExpireStop(ctx context.Context, id string) error
	// Fail records that a running sandbox failed and halts it.
	Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error)
}

func newWatcher(c watchCore) *watcher {
	return &watcher{c: c, ooms: map[string]uint64{}, inits: map[string]hostProc{}}
}

// watchAdapter is the core as the watcher sees it.
type watchAdapter struct{ *Daemon }

var _ watchCore = watchAdapter{}

func (d watchAdapter) ExpireDelete(ctx context.Context, id string) error {
	return d.delete(ctx, "", id, "expiry", "expired")
}

func (d watchAdapter) ExpirePause(ctx context.Context, sb *sandbox.Sandbox) error {
	mode := d.ckpt.DefaultMode(sb)
	if sb.ExpiryPauseMode != "" {
		mode = sb.ExpiryPauseMode
	}
	_, err := d.ckpt.PauseAs(ctx, "", sb.ID, mode, "expiry", "expired")
	return err
}

func (d watchAdapter) ExpireStop(ctx context.Context, id string) error {
	_, err := d.Stop(ctx, "", id, "expiry", "expired")
	return err
}

func (d watchAdapter) Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error) {
	d.fail(ctx, sb, reason, cause)
}

func (w *watcher) expiryLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.expireDue(ctx)
		}
	}
}

// expireDue applies the expiry action of every sandbox past its expiry.
func (w *watcher) expireDue(ctx context.Context) {
	now := w.c.Now()
	// Only those already due are read: this runs every second, and reading
	// every live sandbox each time was a twentieth of an idle daemon's CPU
	// at 1,000 sandboxes.
	list, _, err := w.c.Store().ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running, sandbox.Paused}, ExpiresBy: now})
	if err != nil {
		w.c.Log().Error("expiry scan", "err", err)
		return
	}
	for _, sb := range list {
		if now.Before(sb.ExpiresAt) || now.Before(LeaseUntil(sb)) {
			continue
		}
		if err := w.expire(ctx, sb); err != nil && !errs.Is(err, errs.NotFound) {
			w.c.Log().Error("expire", "sandbox_id", sb.ID, "err", err)
		}
	}
}

func (w *watcher) expire(ctx context.Context, sb *sandbox.Sandbox) error {
	switch sb.ExpiryAction {
	case sandbox.ExpireDelete:
		return w.c.ExpireDelete(ctx, sb.ID)
	case sandbox.ExpirePause:
		if sb.State == sandbox.Paused {
			return nil
		}
		return w.c.ExpirePause(ctx, sb)
	default:
		if sb.State == sandbox.Stopped {
			return nil
		}
		return w.c.ExpireStop(ctx, sb.ID)
	}
}

// watchLoop notices sandboxes whose PID 1 died and OOM kills inside them.
func (w *watcher) watchLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		list, _, err := w.c.Store().ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Running}})
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, sb := range list {
			seen[sb.ID] = true
			w.watchOne(ctx, sb)
		}
		for id := range w.ooms {
			if !seen[id] {
				delete(w.ooms, id)
			}
		}
		for id, p := range w.inits {
			if !seen[id] {
				p.release()
				delete(w.inits, id)
			}
		}
	}
}

func (w *watcher) watchOne(ctx context.Context, sb *sandbox.Sandbox) {
	rt, err := w.c.RuntimeFor(sb)
	if err != nil {
		return
	}
	if kills, err := oomKills(ctx, rt, sb.ID); err == nil {
		if kills > w.ooms[sb.ID] {
			if _, had := w.ooms[sb.ID]; had || kills > 0 {
				w.c.Event(ctx, sb, "kernel", "oom", "oom_kill", "a process was killed for exceeding the memory limit",
					map[string]string{"memory_limit_mib": formatInt(sb.Resources.MemoryMiB)})
			}
		}
		w.ooms[sb.ID] = kills
	}
	if p, ok := w.inits[sb.ID]; ok {
		if p.alive() {
			return
		}
		p.release()
		delete(w.inits, sb.ID)
	}
	unlock := w.c.Lock(sb.ID)
	defer unlock()
	cur, err := w.c.Store().GetSandbox(ctx, sb.ID)
	if err != nil || cur.State != sandbox.Running {
		return
	}
	if st, err := rt.State(ctx, sb.ID); err == nil && (st.State == "running" || st.State == "paused") {
		// runc's Pid is the sandbox's PID 1 on the host; runsc's is its
		// sandbox process, which outlives the container's init.
		if rt.Name() == "runc" {
			if p, ok := hostProcOf(st.Pid); ok {
				w.inits[sb.ID] = p
			}
		}
		return
	}
	w.c.Fail(ctx, cur, "exited", errors.New("the sandbox's init process exited"))
}

// oomCounter is a runtime that reads a sandbox's OOM kill count alone
// (runtime/oci), cheaper than its whole Stats.
type oomCounter interface {
	OOMKills(ctx context.Context, id string) (uint64, error)
}

func oomKills(ctx context.Context, rt runtime.Runtime, id string) (uint64, error) {
	if c, ok := rt.(oomCounter); ok {
		return c.OOMKills(ctx, id)
	}
	st, err := rt.Stats(ctx, id)
	return st.OOMKills, err
}

// hostProc names one host process across PID reuse: a pidfd (one poll
// tells whether it still runs), or on a kernel without pidfds (before 5.3)
// its PID and start time (clock ticks after boot, /proc/PID/stat field 22),
// which take an open, read and parse of /proc per check.
type hostProc struct {
	pid   int
	start uint64
	fd    int  // the pidfd, when hasFD
	hasFD bool // (the zero hostProc holds none)
}

// hostProcOf opens pid; false when there is no such live process. The
// caller releases it.
func hostProcOf(pid int) (hostProc, bool) {
	if pid <= 0 {
		return hostProc{}, false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err == nil {
		p := hostProc{pid: pid, fd: fd, hasFD: true}
		if !p.alive() {
			p.release()
			return hostProc{}, false
		}
		return p, true
	}
	if !errors.Is(err, unix.ENOSYS) {
		return hostProc{}, false // ESRCH: no such process
	}
	start, ok := procStart(pid)
	return hostProc{pid: pid, start: start}, ok
}

// procStart reads a live (not zombie) process's start time from /proc.
func procStart(pid int) (uint64, bool) {
	var buf [2048]byte // /proc/PID/stat: 52 numbers and a 16-byte name
	b, err := kfile.Read("/proc/"+strconv.Itoa(pid)+"/stat", buf[:])
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields that follow start after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), f[19] field 22 (starttime).
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// alive reports whether the same process still runs (not a zombie: a
// pidfd polls readable once its process has exited).
func (p hostProc) alive() bool {
	if !p.hasFD {
		start, ok := procStart(p.pid)
		return ok && start == p.start
	}
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// release closes the pidfd.
func (p hostProc) release() {
	if p.hasFD {
		_ = unix.Close(p.fd)
	}
}

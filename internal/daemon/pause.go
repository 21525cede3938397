package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func (d *Daemon) memoryDir(id string) string { return filepath.Join(d.sandboxDir(id), "memory") }

// MemoryPauseSupported reports whether a runtime can take memory checkpoints here.
func (d *Daemon) MemoryPauseSupported(runtimeName string) bool {
	rt, ok := d.runtimes[runtimeName]
	return ok && rt.Capabilities(d.bg).Checkpoint
}

func (d *Daemon) defaultPauseMode(sb *sandbox.Sandbox) sandbox.PauseMode {
	if d.MemoryPauseSupported(sb.Runtime) {
		return sandbox.PauseMemory
	}
	return sandbox.PauseDisk
}

// Pause suspends a running sandbox. mode "" picks memory when the runtime can, else disk.
func (d *Daemon) Pause(ctx context.Context, owner, id string, mode sandbox.PauseMode) (*sandbox.Sandbox, error) {
	return d.pause(ctx, owner, id, mode, owner, "paused")
}

func (d *Daemon) pause(ctx context.Context, owner, id string, mode sandbox.PauseMode, actor, reason string) (*sandbox.Sandbox, error) {
	unlock := d.lock(id)
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	sb, err := d.visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if mode == "" {
		mode = d.defaultPauseMode(sb)
	}
	if err := sandbox.ValidPauseMode(mode); err != nil {
		return nil, err
	}
	if sb.State != sandbox.Running {
		return nil, &sandbox.TransitionError{From: sb.State, To: sandbox.Paused}
	}
	rt, err := d.runtimeFor(sb)
	if err != nil {
		return nil, err
	}
	// Intent before effect: a crash while pausing is resolved by reconcilePaused.
	if _, err := d.transition(ctx, id, sandbox.Pausing, actor, reason, "", func(s *sandbox.Sandbox) error {
		s.PauseRequested = mode
		return nil
	}); err != nil {
		return nil, err
	}
	d.notifyPaused(id)
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	start := time.Now()
	actual, why := mode, ""
	var release func(context.Context) error
	switch mode {
	case sandbox.PauseFreeze:
		if err := rt.Freeze(tctx, id); err != nil {
			// Fall back to a disk pause: still honest, still keeps every file.
			actual, why = sandbox.PauseDisk, "freeze failed: "+shortError(err)
		}
	case sandbox.PauseMemory:
		if caps := rt.Capabilities(tctx); !caps.Checkpoint {
			actual, why = sandbox.PauseDisk, "runtime "+sb.Runtime+" cannot checkpoint memory here: "+caps.CheckpointReason
		} else if release, err = d.checkpoint(tctx, sb); err != nil {
			actual, why = sandbox.PauseDisk, "memory checkpoint failed: "+shortError(err)
			d.log.Warn("checkpoint failed", "sandbox_id", id, "err", err)
		}
	}
	if actual == sandbox.PauseDisk {
		if err := d.halt(tctx, sb); err != nil {
			d.fail(tctx, sb, "pause_failed", err)
			return nil, errs.Wrap(errs.Internal, err, "pause sandbox %s", id)
		}
	}
	if why != "" {
		d.event(tctx, sb, "berth", "pause_degraded", "fallback_to_disk", why,
			map[string]string{"requested": string(mode), "actual": string(actual)})
		d.log.Warn("pause degraded", "sandbox_id", id, "requested", mode, "actual", actual, "reason", why)
	}
	out, err := d.transition(tctx, id, sandbox.Paused, actor, reason, why, func(s *sandbox.Sandbox) error {
		s.PauseActual = actual
		if s.Extra == nil {
			s.Extra = map[string]string{}
		}
		s.Extra["pause_ms"] = strconv.FormatInt(time.Since(start).Milliseconds(), 10)
		return nil
	})
	if release != nil {
		// The image is durable and the processes are gone (RAM freed): answer
		// now and release the filesystem and network in the background, still
		// holding the sandbox's lock so a resume waits for it. A crash
		// meanwhile is settled by reconcilePaused.
		handedOff = true
		d.goBackground("release "+id, func(bg context.Context) {
			defer unlock()
			rctx, cancel := teardownCtx(bg)
			defer cancel()
			if err := release(rctx); err != nil {
				d.log.Warn("release after checkpoint", "sandbox_id", id, "err", err)
			}
		})
	}
	return out, err
}

// checkpoint quiesces the agent (it closes its host socket, which gVisor
// cannot save), writes the memory image to a temp dir and renames it into
// place, so a crash leaves either no image or a complete one.
func (d *Daemon) checkpoint(ctx context.Context, sb *sandbox.Sandbox) (release func(context.Context) error, err error) {
	rt, err := d.runtimeFor(sb)
	if err != nil {
		return nil, err
	}
	final, tmp := d.memoryDir(sb.ID), d.memoryDir(sb.ID)+".tmp"
	_ = os.RemoveAll(tmp)
	_ = os.RemoveAll(final)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	if err := d.quiesceAgent(ctx, sb.ID); err != nil {
		_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
		return nil, fmt.Errorf("quiesce agent: %w", err)
	}
	if err := rt.Checkpoint(ctx, sb.ID, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		// A failed checkpoint may leave the container running; let the agent listen again.
		_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return nil, err
	}
	// The container is gone; what remains is releasing its filesystem (the
	// workspace image stays) and its network: restore attaches a fresh
	// namespace (CRIU leaves its network-lock table in the old one, and a
	// restore there fails).
	return func(ctx context.Context) error {
		d.dropClient(sb.ID)
		_ = rt.Delete(ctx, sb.ID)
		if err := d.netDown(ctx, sb); err != nil {
			d.log.Warn("detach network after checkpoint", "sandbox_id", sb.ID, "err", err)
		}
		return rootfs.Teardown(ctx, d.sandboxDir(sb.ID))
	}, nil
}

// quiesceAgent asks the agent to close its channel session and stop
// dialing (gVisor cannot checkpoint a connected host socket, nor CRIU an
// external one) and waits until the session is gone: its acknowledgement.
func (d *Daemon) quiesceAgent(ctx context.Context, id string) error {
	ch, err := d.channel(id)
	if err != nil {
		return err
	}
	return ch.Quiesce(ctx, 5*time.Second)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Resume brings a paused sandbox back. A memory image that cannot be
// restored falls back to a cold boot from the workspace, with an event.
func (d *Daemon) Resume(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return d.resume(ctx, owner, id, owner, false)
}

// ResumeCold resumes ignoring any memory image (E2B's connect {"memory":false}).
func (d *Daemon) ResumeCold(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return d.resume(ctx, owner, id, owner, true)
}

func (d *Daemon) resume(ctx context.Context, owner, id, actor string, cold bool) (*sandbox.Sandbox, error) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.visible(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.Paused {
		return nil, &sandbox.TransitionError{From: sb.State, To: sandbox.Running}
	}
	rt, err := d.runtimeFor(sb)
	if err != nil {
		return nil, err
	}
	if _, err := d.transition(ctx, id, sandbox.Resuming, actor, "resuming", "", nil); err != nil {
		return nil, err
	}
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	from, why := sb.PauseActual, ""
	restores := sb.RestoreCount
	switch sb.PauseActual {
	case sandbox.PauseFreeze:
		if err := rt.Thaw(tctx, id); err != nil {
			from, why = sandbox.PauseDisk, "thaw failed: "+shortError(err)
		}
	case sandbox.PauseMemory:
		if cold {
			from, why = sandbox.PauseDisk, "cold resume requested"
		} else if err := d.restore(tctx, sb, restores+1); err != nil {
			from, why = sandbox.PauseDisk, "memory restore failed: "+shortError(err)
			d.log.Warn("restore failed", "sandbox_id", id, "err", err)
		} else {
			restores++
		}
	}
	if from == sandbox.PauseDisk || from == "" {
		from = sandbox.PauseDisk
		_ = d.halt(tctx, sb)
		if err := d.boot(tctx, sb, nil); err != nil {
			d.fail(tctx, sb, "resume_failed", err)
			return nil, err
		}
	}
	_ = os.RemoveAll(d.memoryDir(id))
	if why != "" && sb.PauseActual != sandbox.PauseDisk {
		d.event(tctx, sb, "berth", "resume_degraded", "cold_boot", why,
			map[string]string{"paused_with": string(sb.PauseActual), "resumed_from": string(from)})
	}
	return d.transition(tctx, id, sandbox.Running, actor, "resumed", why, func(s *sandbox.Sandbox) error {
		s.ResumedFrom = from
		s.RestoreCount = restores
		return nil
	})
}

// restore starts the sandbox from its memory image and tells the agent.
func (d *Daemon) restore(ctx context.Context, sb *sandbox.Sandbox, count int) error {
	rt, err := d.runtimeFor(sb)
	if err != nil {
		return err
	}
	img := d.memoryDir(sb.ID)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("no memory image: %w", err)
	}
	tpl, err := d.store.GetTemplate(ctx, sb.Template)
	if err != nil {
		return err
	}
	lowers, err := d.lowersFor(sb, &tpl)
	if err != nil {
		return err
	}
	// As in boot: attach the network while the filesystem is mounted.
	netErr := make(chan error, 1)
	go func() { netErr <- d.netUp(ctx, sb, "") }()
	root, err := rootfs.Remount(ctx, d.sandboxDir(sb.ID), lowers)
	if nerr := <-netErr; err != nil || nerr != nil {
		return errors.Join(err, nerr)
	}
	d.netTrust(sb, root)
	ch, err := d.openChannel(sb.ID)
	if err != nil {
		return err
	}
	if err := rt.Restore(ctx, d.spec(sb, &tpl, root), img); err != nil {
		_ = rt.Delete(ctx, sb.ID)
		return err
	}
	if err := rt.Kill(ctx, sb.ID, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("wake agent: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, d.cfg.ReadyTimeout)
	defer cancel()
	c := ch.Client()
	if _, err := c.WaitReady(wctx, 2*time.Millisecond); err != nil {
		return err
	}
	return c.Restored(ctx, agentapi.RestoredRequest{RestoreCount: count, HostTime: time.Now()})
}

// reconcilePaused settles sandboxes caught mid-pause or mid-resume by a
// daemon crash: never half — either running or paused with a complete image.
func (d *Daemon) reconcilePaused(ctx context.Context, sb *sandbox.Sandbox, alive bool) error {
	rt, err := d.runtimeFor(sb)
	if err != nil {
		return err
	}
	// A partial image (the daemon died while writing it) is never used.
	_ = os.RemoveAll(d.memoryDir(sb.ID) + ".tmp")
	_, imgErr := os.Stat(d.memoryDir(sb.ID))
	hasImage := imgErr == nil
	toPausedDisk := func(reason string) error {
		if err := d.halt(ctx, sb); err != nil {
			return err
		}
		actual := sandbox.PauseDisk
		if hasImage {
			actual = sandbox.PauseMemory
		}
		_, err := d.transition(ctx, sb.ID, sandbox.Paused, "berth", reason, "settled after a daemon restart", func(s *sandbox.Sandbox) error {
			s.PauseActual = actual
			return nil
		})
		return err
	}
	switch sb.State {
	case sandbox.Pausing, sandbox.Resuming:
		if alive && !hasImage {
			_ = rt.Thaw(ctx, sb.ID)
			_ = rt.Kill(ctx, sb.ID, syscall.SIGUSR2)
			hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := d.client(sb.ID).WaitReady(hctx, 20*time.Millisecond)
			cancel()
			if err == nil {
				_, err := d.transition(ctx, sb.ID, sandbox.Running, "berth", "pause_interrupted", "the daemon restarted during a pause or resume; the sandbox kept running", nil)
				return err
			}
		}
		return toPausedDisk("pause_interrupted")
	case sandbox.Paused:
		if sb.PauseActual == sandbox.PauseFreeze {
			if alive {
				return nil
			}
			// The frozen processes are gone (host reboot?): the disk is still the promise.
			d.event(ctx, sb, "berth", "pause_degraded", "freeze_lost", "frozen processes were gone after a restart; the workspace is kept",
				map[string]string{"requested": string(sandbox.PauseFreeze), "actual": string(sandbox.PauseDisk)})
			return toPausedDisk("freeze_lost")
		}
		if alive {
			return d.halt(ctx, sb)
		}
		return nil
	}
	return errors.New("unexpected state " + string(sb.State))
}

var errPaused = errs.E(errs.Unavailable, "sandbox paused")

// notifyPaused ends open streams of a sandbox that is being paused.
func (d *Daemon) notifyPaused(id string) {
	d.pauseMu.Lock()
	if ch, ok := d.pauseCh[id]; ok {
		close(ch)
		delete(d.pauseCh, id)
	}
	d.pauseMu.Unlock()
}

// PauseSignal returns a channel closed when the sandbox starts pausing.
// Stream handlers select on it to end with a clear "sandbox paused" error.
func (d *Daemon) PauseSignal(id string) <-chan struct{} {
	d.pauseMu.Lock()
	defer d.pauseMu.Unlock()
	ch, ok := d.pauseCh[id]
	if !ok {
		ch = make(chan struct{})
		d.pauseCh[id] = ch
	}
	return ch
}

// ErrPaused is the error streams end with when their sandbox is paused.
func ErrPaused() error { return errPaused }

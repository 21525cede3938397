package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/creack/pty"
)

// startSpec is a fully resolved command: what to run, as whom, where, with what.
type startSpec struct {
	argv  []string
	env   map[string]string
	cwd   string
	acct  account
	stdin bool
	tty   *agentapi.TTYSize
}

// planExec validates an ExecRequest and resolves user, argv, cwd and env.
func (a *Agent) planExec(req agentapi.ExecRequest) (startSpec, error) {
	acct, _, err := a.account(req.User)
	if err != nil {
		return startSpec{}, err
	}
	var argv []string
	switch {
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
		if req.Login {
			if _, err := os.Stat("/bin/bash"); err == nil {
				argv = []string{"/bin/bash", "-l", "-c", req.Shell}
			}
		}
	case len(req.Argv) > 0 && req.Argv[0] != "":
		argv = req.Argv
	default:
		return startSpec{}, errs.Field("argv", "one of argv or shell is required")
	}
	if req.TimeoutMs < 0 {
		return startSpec{}, errs.Field("timeout_ms", "must be >= 0, got %d", req.TimeoutMs)
	}
	cwd := resolvePath(acct, req.Cwd)
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return startSpec{}, errs.Field("cwd", "%s is not an existing directory", cwd)
	}
	env, err := a.buildEnv(acct, req.Env, req.TTY != nil)
	if err != nil {
		return startSpec{}, err
	}
	return startSpec{argv: argv, env: env, cwd: cwd, acct: acct, stdin: req.Stdin, tty: req.TTY}, nil
}

// buildEnv layers, lowest first: PATH; HOME/USER/LOGNAME; the daemon's
// defaults from env.json (re-read whenever it changed); BERTH_SANDBOX_ID and
// BERTH_RESTORE_COUNT; the request's env.
func (a *Agent) buildEnv(acct account, reqEnv map[string]string, tty bool) (map[string]string, error) {
	env := map[string]string{"PATH": DefaultPath, "HOME": acct.Home, "USER": acct.Name, "LOGNAME": acct.Name}
	if tty {
		env["TERM"] = "xterm-256color"
	}
	defaults, err := a.envCache.get(time.Now(), []string{a.cfg.EnvFile}, a.readEnvFile)
	if err != nil {
		return nil, err
	}
	maps.Copy(env, defaults)
	if a.cfg.SandboxID != "" {
		env["BERTH_SANDBOX_ID"] = a.cfg.SandboxID
	}
	if id := a.forkID.Load(); id != nil {
		env["BERTH_SANDBOX_ID"] = *id
	}
	if a.cfg.APISocket != "" {
		env["BERTH_API_SOCKET"] = a.cfg.APISocket
	}
	if n := a.restoreCount.Load(); n > 0 {
		env["BERTH_RESTORE_COUNT"] = strconv.FormatInt(n, 10)
	}
	maps.Copy(env, reqEnv)
	return env, nil
}

// readEnvFile reads the daemon's default env (none when the file is absent).
func (a *Agent) readEnvFile() (map[string]string, error) {
	b, err := readSmallFile(a.cfg.EnvFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read %s", a.cfg.EnvFile)
	}
	var defaults map[string]string
	if err := json.Unmarshal(b, &defaults); err != nil {
		a.log.Warn("ignoring malformed env file", "path", a.cfg.EnvFile, "err", err)
	}
	return defaults, nil
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// lookPath finds argv0 in the process's own PATH, not the agent's.
func lookPath(argv0, path, cwd string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if isExecutable(p) {
			return p, nil
		}
		return "", errs.Field("argv", "%s is not an executable file", argv0)
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		if p := filepath.Join(dir, argv0); isExecutable(p) {
			return p, nil
		}
	}
	return "", errs.Field("argv", "executable %q not found in PATH", argv0)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// agentUID and agentGID are the agent's own ids, which never change: read
// once, not on every exec (each is a syscall, a Sentry trip under gVisor).
var (
	agentUID = sync.OnceValue(os.Getuid)
	agentGID = sync.OnceValue(os.Getgid)
)

// credential returns the identity to switch to, or nil when already it.
func credential(acct account) (*syscall.Credential, error) {
	uid := agentUID()
	if uid == acct.UID && agentGID() == acct.GID && uid != 0 {
		return nil, nil
	}
	if uid != 0 {
		return nil, errs.E(errs.PermissionDenied, "agent is not root; cannot run as %s", acct.Name)
	}
	groups := make([]uint32, len(acct.Groups))
	for i, g := range acct.Groups {
		groups[i] = uint32(g)
	}
	return &syscall.Credential{Uid: uint32(acct.UID), Gid: uint32(acct.GID), Groups: groups}, nil
}

// spawn starts spec in its own process group (session, with a PTY) and
// returns the running process; the caller subscribes before calling p.start.
func (a *Agent) spawn(spec startSpec, tag string) (*process, <-chan syscall.WaitStatus, error) {
	argv0, err := lookPath(spec.argv[0], spec.env["PATH"], spec.cwd)
	if err != nil {
		return nil, nil, err
	}
	cred, err := credential(spec.acct)
	if err != nil {
		return nil, nil, err
	}
	p := newProcess(agentapi.ProcessInfo{Tag: tag, Argv: spec.argv, Env: spec.env, Cwd: spec.cwd,
		User: spec.acct.Name, TTY: spec.tty != nil, Start: time.Now().UTC()})
	// The child's ends are plain fds, never registered with Go's poller,
	// closed in the parent after fork: under gVisor every syscall is a trip
	// to the Sentry, and os.Open/os.Pipe cost 4-6 of them per fd (docs/EXEC.md).
	var childFDs []int
	var childFiles []*os.File
	defer func() {
		for _, fd := range childFDs {
			syscall.Close(fd)
		}
		for _, f := range childFiles {
			f.Close()
		}
	}()
	fail := func(err error) (*process, <-chan syscall.WaitStatus, error) {
		for _, f := range p.outputs {
			f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, err
	}
	sys := &syscall.SysProcAttr{Credential: cred}
	var fds []uintptr
	if spec.tty != nil {
		master, slave, err := openPTY(spec.tty)
		if err != nil {
			return fail(errs.Wrap(errs.Internal, err, "open pty"))
		}
		p.pty = master
		p.outputs = []*os.File{master}
		childFiles = append(childFiles, slave)
		fds = []uintptr{slave.Fd(), slave.Fd(), slave.Fd()}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		if spec.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(errs.Wrap(errs.Internal, err, "stdin pipe"))
			}
			p.stdin = w
			childFiles = append(childFiles, r)
			fds = append(fds, r.Fd())
		} else {
			null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				return fail(errs.Wrap(errs.Internal, err, "open %s", os.DevNull))
			}
			childFDs = append(childFDs, null)
			fds = append(fds, uintptr(null))
		}
		for _, name := range []string{"stdout", "stderr"} {
			r, w, err := outputPipe(name)
			if err != nil {
				return fail(errs.Wrap(errs.Internal, err, "output pipe"))
			}
			p.outputs = append(p.outputs, r)
			childFDs = append(childFDs, w)
			fds = append(fds, uintptr(w))
		}
		sys.Setpgid = true
	}
	pid, exited, err := a.children.start(argv0, spec.argv,
		&syscall.ProcAttr{Dir: spec.cwd, Env: envList(spec.env), Files: fds, Sys: sys})
	if err != nil {
		return fail(errs.Wrap(errs.InvalidArgument, err, "start %s", spec.argv[0]))
	}
	p.pid = pid
	p.info.Pid = pid
	return p, exited, nil
}

// outputPipe returns a pipe whose read end is the agent's (non-blocking,
// through the poller) and whose write end is a plain blocking fd for the
// child; both close on exec.
func outputPipe(name string) (*os.File, int, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	if err := syscall.SetNonblock(p[0], true); err != nil {
		syscall.Close(p[0])
		syscall.Close(p[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(p[0]), "|"+name), p[1], nil
}

func openPTY(size *agentapi.TTYSize) (master, slave *os.File, err error) {
	m, s, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	cols, rows := size.Cols, size.Rows
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	if err := pty.Setsize(s, &pty.Winsize{Cols: cols, Rows: rows}); err != nil {
		m.Close()
		s.Close()
		return nil, nil, err
	}
	// pty.Open leaves the master in blocking mode, where Close cannot
	// interrupt a pending Read; a non-blocking dup goes through the poller.
	fd, err := syscall.Dup(int(m.Fd()))
	m.Close()
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		s.Close()
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), s, nil
}

// launch registers a spawned process and starts driving it.
func (a *Agent) launch(p *process, exited <-chan syscall.WaitStatus, timeout time.Duration) {
	a.mu.Lock()
	a.pruneLocked(time.Now())
	a.procs[p.pid] = p
	a.mu.Unlock()
	a.running.Add(1)
	a.lastExec.Store(time.Now().UnixNano())
	a.procWG.Add(1)
	go func() {
		defer a.procWG.Done()
		p.run(exited, timeout, func() { a.running.Add(-1) })
	}()
}

func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	keepalive, err := keepaliveParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	t0 := time.Now()
	var req agentapi.ExecRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	spec, err := a.planExec(req)
	if err != nil {
		writeError(w, err)
		return
	}
	t1 := time.Now()
	p, exited, err := a.spawn(spec, req.Tag)
	if err != nil {
		writeError(w, err)
		return
	}
	t2 := time.Now()
	sub, _, _ := p.subscribe() // before any output is read
	a.launch(p, exited, time.Duration(req.TimeoutMs)*time.Millisecond)
	a.stream(r.Context(), w, p, sub, agentapi.Event{}, keepalive, &execClock{enter: t0, planned: t1, spawned: t2})
	a.log.Debug("exec", "pid", p.pid, "argv", spec.argv, "user", spec.acct.Name, "tty", spec.tty != nil)
}

// execClock is when an exec's request arrived, was planned and spawned;
// stream adds the rest to its exit event (agentapi.ExecPhases).
type execClock struct{ enter, planned, spawned, started time.Time }

func (c *execClock) phases(p *process) *agentapi.ExecPhases {
	ex, dr := p.exitTimes()
	return &agentapi.ExecPhases{PlanUs: usBetween(c.enter, c.planned), SpawnUs: usBetween(c.planned, c.spawned),
		StartUs: usBetween(c.spawned, c.started), RunUs: usBetween(c.started, ex), DrainUs: usBetween(ex, dr)}
}

func (a *Agent) handleAttach(w http.ResponseWriter, r *http.Request) {
	keepalive, err := keepaliveParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	p, err := a.lookupProcess(r)
	if err != nil {
		writeError(w, err)
		return
	}
	sub, _, result := p.subscribe()
	a.stream(r.Context(), w, p, sub, result, keepalive, nil)
}

// stream writes start, then the subscriber's events until exit. With a nil
// subscriber the process had already ended: start and its exit event only.
// A client going away ends only the stream, never the process. clock (an
// /exec stream's) puts the exec's phases on its exit event.
func (a *Agent) stream(ctx context.Context, w http.ResponseWriter, p *process, sub *subscriber, result agentapi.Event, keepalive time.Duration, clock *execClock) {
	a.openStreams.Add(1)
	defer a.openStreams.Add(-1)
	out := startNDJSON(w, keepalive)
	defer out.stop()
	if sub != nil {
		defer p.unsubscribe(sub)
	}
	if err := out.write(agentapi.Event{Type: "start", Pid: p.pid}); err != nil {
		return
	}
	if clock != nil {
		clock.started = time.Now()
	}

	if sub == nil {
		_ = out.writeLast(result)
		return
	}
	for {
		select {
		case ev, ok := <-sub.ch:
			if !ok {
				return
			}
			if ev.Type == "exit" { // always the last event (process.finish)
				last := agentapi.StreamEvent{Event: ev}
				if clock != nil {
					last.Phases = clock.phases(p)
				}
				_ = out.writeLast(last)
				return
			}
			if err := out.write(ev); err != nil {
				return
			}
		case <-out.keepalive():
			if err := out.write(agentapi.Event{Type: "keepalive"}); err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (a *Agent) handleProcesses(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.pruneLocked(time.Now())
	list := []agentapi.ProcessInfo{}
	for _, p := range a.procs {
		if !p.isFinished() {
			list = append(list, p.info)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(list, func(x, y agentapi.ProcessInfo) int { return x.Pid - y.Pid })
	writeJSON(w, http.StatusOK, list)
}

// liveProcess finds a running process; an exited or unknown pid is NotFound.
func (a *Agent) liveProcess(r *http.Request) (*process, error) {
	p, err := a.lookupProcess(r)
	if err != nil {
		return nil, err
	}
	if p.isFinished() {
		return nil, errs.E(errs.NotFound, "process %d has exited", p.pid)
	}
	return p, nil
}

func (a *Agent) handleInput(w http.ResponseWriter, r *http.Request) {
	p, err := a.liveProcess(r)
	if err != nil {
		writeError(w, err)
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		writeError(w, errs.Wrap(errs.InvalidArgument, err, "read input body"))
		return
	}
	if err := p.writeInput(data); err != nil {
		if errors.Is(err, errStdinClosed) {
			writeError(w, errs.Wrap(errs.FailedPrecondition, err, "process %d", p.pid))
			return
		}
		writeError(w, errs.Wrap(errs.Internal, err, "write input to %d", p.pid))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.liveProcess(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := p.closeStdin(); err != nil {
		writeError(w, errs.Wrap(errs.Internal, err, "close stdin of %d", p.pid))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleSignal(w http.ResponseWriter, r *http.Request) {
	p, err := a.liveProcess(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req agentapi.SignalRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Signal < 0 || req.Signal > 64 {
		writeError(w, errs.Field("signal", "must be a signal number 0-64, got %d", req.Signal))
		return
	}
	if err := syscall.Kill(-p.pid, syscall.Signal(req.Signal)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			writeError(w, errs.E(errs.NotFound, "process %d not found", p.pid))
			return
		}
		writeError(w, errs.Wrap(errs.Internal, err, "signal %d", p.pid))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleResize(w http.ResponseWriter, r *http.Request) {
	p, err := a.liveProcess(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req agentapi.ResizeRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Cols == 0 || req.Rows == 0 {
		writeError(w, errs.Field("cols", "cols and rows must be > 0, got %dx%d", req.Cols, req.Rows))
		return
	}
	if err := p.resize(req.Cols, req.Rows); err != nil {
		if errors.Is(err, errNoTTY) {
			writeError(w, errs.Wrap(errs.FailedPrecondition, err, "resize %d", p.pid))
			return
		}
		writeError(w, errs.Wrap(errs.Internal, err, "resize %d", p.pid))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// usBetween is b-a in µs; 0 when either is unknown.
func usBetween(a, b time.Time) int64 {
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a).Microseconds()
}

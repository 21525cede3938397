package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// runsc pause and resume without the runsc binary.
//
// `runsc pause ID` loads the container's state file under its lock, asks
// the sandbox's control server (the Sentry, over the unix socket
// runsc-<sandbox>.sock that `runsc create` bound in the root dir) to
// call containerManager.Pause, and saves the state file with status
// "paused"; resume is the same with Resume and "running". As two execs of
// the ~60 MB runsc binary that is 25–35 ms of a files-only checkpoint on
// a loaded host; runscControl does the same three steps in-process.
//
// The wire protocol (gVisor's urpc over a SOCK_STREAM unix socket): the
// client writes one JSON object {"method": M, "arg": A}; the server
// answers one JSON object {"success": bool, "err": string, "result": R}.
// No framing beyond JSON itself; file descriptors may ride along as
// SCM_RIGHTS (none for Pause/Resume; plain reads make the kernel drop any
// a hostile Sentry sends).
//
// runsc's own state is kept: `runsc state`, `runsc checkpoint`, `runsc
// delete` and berth's reconcile read the state file, so a direct pause
// that left it saying "running" would let a later `runsc pause` stop the
// Sentry's tasks a second time (its stop is counted, one resume would no
// longer start them). So the status is written as runsc writes it, under
// the same flock(2) of <id>_sandbox:<sandbox>.lock that runsc holds
// around its load, call and save; atomically (rename), where runsc
// truncates and writes in place.

// controlAnswerWait bounds the wait for the Sentry's answer once a call
// is sent (Pause returns once every task has stopped). The caller's ctx
// does not cut it short: a call abandoned after it was sent would leave
// the Sentry paused and the state file saying running. (A var: tests
// shorten it.)
var controlAnswerWait = 10 * time.Second

const (
	// controlTimeout bounds the steps before a call is sent: lock, state
	// file, connect.
	controlTimeout = 10 * time.Second
	// maxStateFile bounds a read of a state file: the container's OCI
	// spec and the sandbox's fields as JSON, tens of KiB for berth's.
	maxStateFile = 4 << 20
	// maxControlAnswer bounds the Sentry's answer to a call, which for
	// Pause and Resume is {"success":true,"err":"","result":{}}.
	maxControlAnswer = 64 << 10
)

// runscCall is one control call and the container status it moves between.
type runscCall struct {
	op, method string
	from, to   string
}

var (
	runscPause  = runscCall{op: "pause", method: "containerManager.Pause", from: "running", to: "paused"}
	runscResume = runscCall{op: "resume", method: "containerManager.Resume", from: "paused", to: "running"}
)

// notSentError is a direct call that failed before its request was
// written: the Sentry was not asked, so the runsc command may be.
// After the request is written a failure is final: the Sentry may have
// acted on it, and asking again through runsc could pause twice.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

func notSent(k errs.Kind, format string, args ...any) error {
	return &notSentError{errs.E(k, format, args...)}
}

func notSentWrap(k errs.Kind, err error, format string, args ...any) error {
	return &notSentError{errs.Wrap(k, err, format, args...)}
}

// runscState is the part of runsc's container state file runscControl checks.
type runscState struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Sandbox *struct {
		ID                string `json:"id"`
		Pid               int    `json:"pid"`
		ControlSocketPath string `json:"controlSocketPath"`
	} `json:"sandbox"`
}

// runscControl makes call c on root container id's Sentry and records
// the new status in runsc's state file. Every path is opened beneath the
// runsc root (host-owned, mode 0700, never mounted into a sandbox) with
// no symlink followed.
func (o *OCI) runscControl(ctx context.Context, id string, c runscCall) error {
	if o.name != Runsc {
		return notSent(errs.NotImplemented, "%s has no control socket", o.name)
	}
	if !idPattern.MatchString(id) {
		return notSent(errs.InvalidArgument, "id %q is not a valid id", id)
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	root, err := openRunscRoot(o.cfg.Root)
	if err != nil {
		return err
	}
	defer unix.Close(root)

	// A berth sandbox is one root container: sandbox id = container id.
	base := id + "_sandbox:" + id
	unlock, err := lockAt(ctx, root, base+".lock")
	if err != nil {
		return err
	}
	defer unlock()
	raw, st, err := readStateAt(root, base+".state")
	if err != nil {
		return err
	}
	if st.ID != id || st.Sandbox == nil || st.Sandbox.ID != id {
		return notSent(errs.FailedPrecondition, "runsc state of %s names another container", id)
	}
	if st.Status != c.from {
		return notSent(errs.FailedPrecondition, "runsc container %s is %s, not %s", id, st.Status, c.from)
	}
	sock := "runsc-" + id + ".sock"
	// runsc falls back to /var/run, /run or /tmp when it cannot bind in
	// its root; a socket there could be anyone's.
	if st.Sandbox.ControlSocketPath != filepath.Join(o.cfg.Root, sock) {
		return notSent(errs.FailedPrecondition, "control socket of %s is %q, not in the runsc root", id, st.Sandbox.ControlSocketPath)
	}
	conn, err := dialControlAt(ctx, root, sock, st.Sandbox.Pid)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := controlCall(ctx, conn, c.method, controlAnswerWait); err != nil {
		return errs.Wrap(errs.KindOf(err), err, "runsc %s %s over the control socket", c.op, id)
	}
	if err := writeStatusAt(root, base+".state", raw, c.to); err != nil {
		// The Sentry did it and said so, so undoing it is safe (its stop
		// count is known): the Sentry goes back to what the file says.
		err = errs.Wrap(errs.Internal, err, "runsc %s %s: record the status", c.op, id)
		if uerr := controlCall(ctx, conn, c.undo().method, controlAnswerWait); uerr != nil {
			return errors.Join(err, errs.Wrap(errs.KindOf(uerr), uerr, "undo: the Sentry is %s, its state file says %s", c.to, c.from))
		}
		return err
	}
	return nil
}

// undo is the call that reverses c.
func (c runscCall) undo() runscCall {
	if c.method == runscPause.method {
		return runscResume
	}
	return runscPause
}

// openRunscRoot opens the runsc root as an O_PATH descriptor and checks
// that only this process's user can write in it.
func openRunscRoot(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, notSentWrap(errs.Unavailable, err, "open runsc root %s", path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, notSentWrap(errs.Internal, err, "stat runsc root %s", path)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return -1, notSent(errs.FailedPrecondition, "runsc root %s is owned by uid %d with mode %o: others could plant its socket", path, st.Uid, st.Mode&0o7777)
	}
	return fd, nil
}

// openAt opens name in dir without following a symlink and checks it is
// a file of type typ owned by this process's user.
func openAt(dir int, name string, flags int, typ uint32) (int, error) {
	fd, err := unix.Openat(dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, notSentWrap(errs.NotFound, err, "open %s in the runsc root", name)
		}
		return -1, notSentWrap(errs.FailedPrecondition, err, "open %s in the runsc root", name)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, notSentWrap(errs.Internal, err, "stat %s", name)
	}
	if st.Mode&unix.S_IFMT != typ || int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, notSent(errs.FailedPrecondition, "%s in the runsc root is not a host-owned file of the expected type (mode %o, uid %d)", name, st.Mode, st.Uid)
	}
	return fd, nil
}

// lockAt takes runsc's exclusive flock on the container's lock file,
// polling so that ctx bounds the wait (a blocking flock cannot be
// interrupted).
func lockAt(ctx context.Context, dir int, name string) (unlock func(), err error) {
	fd, err := openAt(dir, name, unix.O_RDONLY, unix.S_IFREG)
	if err != nil {
		return nil, err
	}
	delay := 100 * time.Microsecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(fd, unix.LOCK_UN); unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return nil, notSentWrap(errs.Internal, err, "lock %s", name)
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, notSentWrap(errs.Unavailable, ctx.Err(), "lock %s: held by a runsc command", name)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

// readStateAt reads and decodes a container state file, bounded.
func readStateAt(dir int, name string) ([]byte, runscState, error) {
	fd, err := openAt(dir, name, unix.O_RDONLY, unix.S_IFREG)
	if err != nil {
		return nil, runscState{}, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return nil, runscState{}, notSentWrap(errs.Internal, err, "read %s", name)
	}
	if len(raw) > maxStateFile {
		return nil, runscState{}, notSent(errs.FailedPrecondition, "%s is larger than %d bytes", name, maxStateFile)
	}
	var st runscState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, runscState{}, notSentWrap(errs.Internal, err, "decode %s", name)
	}
	return raw, st, nil
}

// writeStatusAt replaces the status in state file name with status,
// keeping every other field as runsc wrote it, by a rename over it.
// Without fsync, as runsc's own save: the file describes processes that
// a crash of the host ends anyway.
func writeStatusAt(dir int, name string, raw []byte, status string) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	fields["status"], _ = json.Marshal(status)
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	// Not a *.state name: runsc's listing globs for those.
	tmp := name + ".berth-tmp"
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dir, tmp, dir, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
	}
	return err
}

// dialControlAt connects to the control socket name in dir through
// /proc/self/fd of an O_PATH descriptor of it: the socket opened is the
// one checked (no path is resolved again), and a long root does not hit
// the 108-byte limit of a unix socket address. The listener must be the
// sandbox process the state file names (pid < 0: not checked).
func dialControlAt(ctx context.Context, dir int, name string, pid int) (*net.UnixConn, error) {
	fd, err := openAt(dir, name, unix.O_PATH, unix.S_IFSOCK)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, notSentWrap(errs.Unavailable, err, "connect to %s", name)
	}
	conn := c.(*net.UnixConn)
	if pid >= 0 {
		if err := checkPeer(conn, pid); err != nil {
			conn.Close()
			return nil, &notSentError{errs.Wrap(errs.FailedPrecondition, err, "%s", name)}
		}
	}
	return conn, nil
}

// checkPeer checks that the process listening on conn's other end is pid.
func checkPeer(conn *net.UnixConn, pid int) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if int(cred.Pid) != pid {
		return fmt.Errorf("listened on by pid %d, not by the sandbox's %d", cred.Pid, pid)
	}
	return nil
}

// controlCall writes one urpc call without arguments and reads its
// answer, bounded in size and by wait from the write on; ctx is only
// checked before the call is sent.
func controlCall(ctx context.Context, conn *net.UnixConn, method string, wait time.Duration) error {
	if err := ctx.Err(); err != nil {
		return notSentWrap(errs.Unavailable, err, "send %s", method)
	}
	_ = conn.SetDeadline(time.Now().Add(wait))
	req, err := json.Marshal(struct {
		Method string   `json:"method"`
		Arg    struct{} `json:"arg"`
	}{Method: method})
	if err != nil {
		return &notSentError{errs.Wrap(errs.Internal, err, "encode %s", method)}
	}
	if n, err := conn.Write(req); err != nil {
		if n == 0 {
			return notSentWrap(errs.Unavailable, err, "send %s", method)
		}
		return errs.Wrap(errs.Unavailable, err, "send %s", method)
	}
	var ans struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	lr := &io.LimitedReader{R: conn, N: maxControlAnswer}
	if err := json.NewDecoder(lr).Decode(&ans); err != nil {
		if lr.N <= 0 {
			return errs.E(errs.Internal, "%s: the answer is larger than %d bytes", method, maxControlAnswer)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errs.Wrap(errs.Unavailable, err, "%s: no answer within %s", method, wait)
		}
		return errs.Wrap(errs.Internal, err, "%s: decode the answer", method)
	}
	if !ans.Success {
		msg := tail(ans.Err, 512)
		return errs.E(classify(msg), "%s: %s", method, strconv.Quote(msg))
	}
	return nil
}

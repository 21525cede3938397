package timeline

import (
	"context"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// killWait bounds how long killFirst waits for PID 1 to exit.
const killWait = 2 * time.Second

// killFirst ends a runc sandbox's processes before the halt: SIGKILL to
// PID 1 and a wait on a pidfd until it has exited — in its own PID
// namespace, its exit takes every other process of the sandbox with it.
// `runc delete --force` on a running container signals it and then polls
// every 100 ms until it is gone (≥ 100 ms of a rewind's time); on a
// stopped one it only cleans up. The halt that
// follows (Core.Halt) is unchanged and still removes the container, its
// cgroup, network and mounts, so whatever happens here (an error, a PID
// reused between the state and the pidfd, a wait that times out) costs at
// most time, never a process left running. runsc is left to its own
// delete: its PID 1 is the Sentry's, not a host process.
func (s *Service) killFirst(ctx context.Context, sb *sandbox.Sandbox) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil || rt.Name() != "runc" {
		return
	}
	// Without an exec: PID 1 found in the container's cgroup and killed
	// through a pidfd (oci.OCI.KillInit). The runtime's own state and kill
	// below only where that cannot find it.
	if ik, ok := rt.(initKiller); ok {
		err := ik.KillInit(ctx, sb.ID, killWait)
		if err == nil || !errs.Is(err, errs.NotFound) && !errs.Is(err, errs.NotImplemented) {
			if err != nil {
				s.log.Debug("timeline: kill before halt", "sandbox_id", sb.ID, "err", err)
			}
			return
		}
	}
	st, err := rt.State(ctx, sb.ID)
	if err != nil || st.Pid <= 0 || st.State != "running" {
		return
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if err := rt.Kill(ctx, sb.ID, syscall.SIGKILL); err != nil {
		s.log.Debug("timeline: kill before halt", "sandbox_id", sb.ID, "err", err)
		return
	}
	deadline := time.Now().Add(killWait)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n > 0 {
			return // exited (or the pidfd cannot tell: the halt deletes anyway)
		}
	}
}

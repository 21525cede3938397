package oci

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// KillProcesses ends every process of a container without an exec of the
// runtime, and returns nil only once none of them runs: SIGKILL through a
// pidfd to each process of its cgroup that is PID 1 of a namespace one
// level below ours (isInitOf), then a wait of at most wait for each to
// exit. The container itself (its state, cgroups) is left for Delete, which
// is then quick: it has nothing left to kill.
//
// runc: that is PID 1 (KillInit); a frozen cgroup is thawed after the
// signal, since a v1-frozen task dies only once it runs again. runsc: the
// Sentry and the gofer are each the init of their own namespace, and the
// Sentry's exit ends its platform's stub processes, which live in its
// namespace; the sandbox's own processes are the Sentry's tasks, not host
// processes.
//
// A cgroup that holds no process (or no cgroup at all: never started, or
// deleted) is nil: nothing runs. An error means the caller cannot rely on
// the processes being gone and must fall back to the runtime's delete.
func (o *OCI) KillProcesses(ctx context.Context, id string, wait time.Duration) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	dir, err := o.procsDir(id)
	if errs.Is(err, errs.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read the cgroup of %s", id)
	}
	if len(pids) == 0 {
		return nil
	}
	cg := CgroupPath(id)
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range pids {
		// Opened before it is checked: a pid reused after the check is
		// a pidfd that signals no one (KillInit says why).
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		if !isInitOf(pid, cg) {
			unix.Close(fd)
			continue
		}
		fds = append(fds, fd)
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
			return errs.Wrap(errs.Internal, err, "kill PID 1 of %s", id)
		}
	}
	if len(fds) == 0 {
		return errs.E(errs.FailedPrecondition, "the cgroup of %s holds processes but no namespace init", id)
	}
	if o.name == Runc {
		if st, v2, err := o.freezer(id); err == nil {
			if cur, err := readCgroupFile(st); err == nil && cur != thawValue(v2) {
				_ = writeCgroupFile(st, thawValue(v2))
			}
		}
	}
	var errList []error
	for _, fd := range fds {
		errList = append(errList, waitPidfd(ctx, fd, wait))
	}
	return errors.Join(errList...)
}

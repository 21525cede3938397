package oci

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// KillInit ends a runc container's processes without an exec of runc:
// SIGKILL to its PID 1, found in its cgroup and held by a pidfd, and a
// wait of at most wait until it has exited. PID 1 is the init of the
// container's PID namespace, so the kernel kills every other process of
// the namespace and reaps them before PID 1's exit is reported: when
// KillInit returns nil, no process of the container runs. The container
// itself is left for Delete (stopped, which is quick: `runc delete` of a
// running container signals and then polls every 100 ms).
//
// Finding PID 1 costs two `runc state`/`runc kill` execs otherwise
// (7–10 ms each on a loaded host). The pid is read from the container's
// cgroup (cgroup.procs: written by the kernel, outside the sandbox's
// reach) and opened as a pidfd *before* it is checked — the process is
// in the container's cgroup and is PID 1 of its own namespace (the last
// NSpid of /proc/PID/status, one level below ours) — so a pid reused by another process after
// the read is either refused by the check or, if it changed after the
// check, a pidfd that signals no one. errs.NotImplemented for runsc (its
// PID 1 is inside the Sentry), errs.NotFound when the cgroup has no such
// process (a caller then deletes as before).
func (o *OCI) KillInit(ctx context.Context, id string, wait time.Duration) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	if o.name != Runc {
		return errs.E(errs.NotImplemented, "%s: PID 1 is not a host process", o.name)
	}
	dir, err := o.procsDir(id)
	if err != nil {
		return err
	}
	pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read the cgroup of %s", id)
	}
	cg := CgroupPath(id)
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		if !isInitOf(pid, cg) {
			unix.Close(fd)
			continue
		}
		defer unix.Close(fd)
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
			if err == unix.ESRCH {
				return nil // exited meanwhile
			}
			return errs.Wrap(errs.Internal, err, "kill PID 1 of %s", id)
		}
		return waitPidfd(ctx, fd, wait)
	}
	return errs.E(errs.NotFound, "no PID 1 in the cgroup of %s", id)
}

// procsDir is a cgroup directory of the container that lists its
// processes: v1 (the freezer's, else the pids controller's) or v2.
func (o *OCI) procsDir(id string) (string, error) {
	cg := CgroupPath(id)
	for _, d := range []string{filepath.Join(o.cfg.CgroupRoot, "freezer", cg), filepath.Join(o.cfg.CgroupRoot, "pids", cg), filepath.Join(o.cfg.CgroupRoot, cg)} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			return d, nil
		}
	}
	return "", errs.E(errs.NotFound, "no cgroup for %s", id)
}

// maxPids bounds how many pids KillInit reads (PID 1 is the first process
// a container has; a cgroup's pids are listed in no order, but a sandbox's
// pid limit keeps the list short).
const maxPids = 1 << 16

func readPids(path string) ([]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(out) < maxPids {
		if n, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out, sc.Err()
}

// isInitOf reports whether host pid is in cgroup cg (any hierarchy) and
// is PID 1 of a namespace one level below this process's /proc.
func isInitOf(pid int, cg string) bool {
	b, err := readBounded(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"), 1<<16)
	if err != nil {
		return false
	}
	in := false
	for _, line := range strings.Split(b, "\n") {
		// hierarchy-ID:controllers:path
		if i := strings.LastIndexByte(line, ':'); i >= 0 && line[i+1:] == cg {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	st, err := readBounded(filepath.Join("/proc", strconv.Itoa(pid), "status"), 1<<16)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(st, "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			// Exactly two levels: this /proc's namespace and the
			// container's. A namespace the sandbox nests inside its own
			// has an init too, and is not the container's.
			f := strings.Fields(rest)
			return len(f) == 2 && f[1] == "1"
		}
	}
	return false
}

func readBounded(path string, max int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, max)
	n := 0
	for n < max {
		k, err := f.Read(b[n:])
		n += k
		if err != nil || k == 0 {
			break
		}
	}
	return string(b[:n]), nil
}

// waitPidfd waits until the process of pidfd fd has exited, at most wait.
func waitPidfd(ctx context.Context, fd int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return errs.E(errs.Unavailable, "PID 1 did not exit within %s", wait)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// At most 100 ms per poll, so that a cancelled ctx is seen.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(left, 100*time.Millisecond).Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return errs.Wrap(errs.Internal, err, "wait for PID 1")
		}
		if n > 0 {
			return nil
		}
	}
}

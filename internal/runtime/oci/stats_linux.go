package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kfile"
	"github.com/berth-dev/berth/internal/runtime"
)

// Stats reads cgroup v1 accounting of the container's cgroup (CgroupPath).
// runc puts the container's processes there, runsc its sandbox (Sentry and
// gofer), so for runsc the numbers are the whole sandbox's host cost.
//
// The cgroup is the container's for as long as the runtime knows it (it
// goes with `delete`), so the runtime is asked only when there is none, for
// its reason: the reaper samples every sandbox each round, and a `runc
// state` process per sandbox made a round at 1,000 sandboxes cost ~12 s of CPU.
func (o *OCI) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if !idPattern.MatchString(id) {
		return runtime.Stats{}, errs.Field("id", "%q is not a valid id", id)
	}
	root, cg := o.cfg.CgroupRoot, CgroupPath(id)
	mem := filepath.Join(root, "memory", cg)
	if _, err := os.Stat(mem); err != nil {
		if _, serr := o.state(ctx, id); serr != nil {
			return runtime.Stats{}, serr
		}
		return runtime.Stats{}, errs.Wrap(errs.Unavailable, err, "cgroup v1 memory controller for %s", id)
	}
	var s runtime.Stats
	var all []error
	read := func(dst *uint64, path string) {
		v, err := kfile.Uint(path)
		if err != nil {
			all = append(all, err)
		}
		*dst = v
	}
	read(&s.CPUUsageNanos, filepath.Join(root, "cpuacct", cg, "cpuacct.usage"))
	read(&s.MemoryBytes, filepath.Join(mem, "memory.usage_in_bytes"))
	read(&s.MemoryPeak, filepath.Join(mem, "memory.max_usage_in_bytes"))
	read(&s.Pids, filepath.Join(root, "pids", cg, "pids.current"))
	oom, err := kfile.Keyed(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	if err != nil {
		all = append(all, err)
	}
	s.OOMKills = oom
	if err := errors.Join(all...); err != nil {
		return s, errs.Wrap(errs.Internal, err, "read cgroup stats of %s", id)
	}
	return s, nil
}

// OOMKills is Stats' OOMKills alone, from the one file that holds it: the
// PID-1 watch asks it of every running sandbox every 2 s, and Stats' five
// reads there were a quarter of an idle daemon's CPU at 1,000 sandboxes.
func (o *OCI) OOMKills(ctx context.Context, id string) (uint64, error) {
	if !idPattern.MatchString(id) {
		return 0, errs.Field("id", "%q is not a valid id", id)
	}
	n, err := kfile.Keyed(filepath.Join(o.cfg.CgroupRoot, "memory", CgroupPath(id), "memory.oom_control"), "oom_kill")
	if err != nil {
		return 0, errs.Wrap(errs.Unavailable, err, "read the OOM kills of %s", id)
	}
	return n, nil
}

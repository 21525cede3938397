package oci

import (
	"context"
	"encoding/json"
	"errors"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
)

// cleanupTimeout bounds undo steps that run after the caller's ctx is gone.
const cleanupTimeout = 30 * time.Second

// Run writes config.json into spec.BundleDir and starts the container
// detached. PID 1's stdout/stderr and the runtime's own messages go to
// spec.LogPath (default BundleDir/runtime.log). On error the container is
// force-deleted.
func (o *OCI) Run(ctx context.Context, spec runtime.Spec) error {
	if err := o.writeBundle(spec); err != nil {
		return err
	}
	done, err := hostSysfs(spec)
	if err != nil {
		return err
	}
	err = o.execDetached(ctx, spec.NetNSPath != "", "run", spec.ID, logPath(spec),
		"run", "--detach", "--bundle", spec.BundleDir, spec.ID)
	err = errors.Join(err, done())
	if err != nil {
		return o.undoStart(spec.ID, err)
	}
	return nil
}

// undoStart removes a container whose start failed and returns err joined
// with any failure to do so.
func (o *OCI) undoStart(id string, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(context.Background()), cleanupTimeout)
	defer cancel()
	if derr := o.Delete(ctx, id); derr != nil {
		return errs.Wrap(errs.KindOf(err), errors.Join(err, derr), "start failed and cleanup failed")
	}
	return err
}

func logPath(spec runtime.Spec) string {
	if spec.LogPath != "" {
		return spec.LogPath
	}
	return filepath.Join(spec.BundleDir, "runtime.log")
}

// writeBundle writes the generated config.json atomically.
func (o *OCI) writeBundle(spec runtime.Spec) error {
	cfg, err := GenerateSpec(spec, o.name)
	if err != nil {
		return err
	}
	clampRlimits(cfg)
	b, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode config.json")
	}
	if err := os.MkdirAll(spec.BundleDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create bundle dir")
	}
	tmp := filepath.Join(spec.BundleDir, ".config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return errs.Wrap(errs.Internal, err, "write config.json")
	}
	if err := os.Rename(tmp, filepath.Join(spec.BundleDir, "config.json")); err != nil {
		return errs.Wrap(errs.Internal, err, "write config.json")
	}
	return nil
}

// ociState is the part of `runc state` / `runsc state` output we use.
type ociState struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"`
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

func (s ociState) status() runtime.Status {
	st := s.Status
	if st == "" {
		st = "stopped"
	}
	return runtime.Status{ID: s.ID, State: st, Pid: s.Pid, Created: s.Created}
}

// State reports one container; errs.NotFound if the runtime does not know it.
func (o *OCI) State(ctx context.Context, id string) (runtime.Status, error) {
	st, err := o.state(ctx, id)
	if err != nil {
		return runtime.Status{}, err
	}
	return st.status(), nil
}

func (o *OCI) state(ctx context.Context, id string) (ociState, error) {
	if !idPattern.MatchString(id) {
		return ociState{}, errs.Field("id", "%q is not a valid id", id)
	}
	out, err := o.exec(ctx, false, "state", id, "state", id)
	if err != nil {
		return ociState{}, err
	}
	var st ociState
	if err := json.Unmarshal(out, &st); err != nil {
		return ociState{}, errs.Wrap(errs.Internal, err, "%s state %s: decode %q", o.name, id, tail(string(out), 512))
	}
	if st.Created.IsZero() {
		st.Created = o.runscCreated(id)
	}
	return st, nil
}

// List reports every container under this backend's root.
func (o *OCI) List(ctx context.Context) ([]runtime.Status, error) {
	out, err := o.exec(ctx, false, "list", "", "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var states []ociState
	if err := json.Unmarshal(out, &states); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "%s list: decode %q", o.name, tail(string(out), 512))
	}
	res := make([]runtime.Status, 0, len(states))
	for _, s := range states {
		if s.Created.IsZero() {
			s.Created = o.runscCreated(s.ID)
		}
		res = append(res, s.status())
	}
	return res, nil
}

// Kill sends sig to the container's PID 1.
func (o *OCI) Kill(ctx context.Context, id string, sig syscall.Signal) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	_, err := o.exec(ctx, false, "kill", id, "kill", id, strconv.Itoa(int(sig)))
	return err
}

// Delete force-removes the container; a missing container is not an error.
func (o *OCI) Delete(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	o.endPageLoad(id)
	_, err := o.exec(ctx, false, "delete", id, "delete", "--force", id)
	if errs.Is(err, errs.NotFound) {
		return nil
	}
	return err
}

// Freeze stops every process of the container: runc's with the cgroup
// freezer written directly (freezeCgroup: what `runc pause` does, without
// the exec; `runc pause` only where the container has no freezer cgroup
// of its own), runsc's by asking its Sentry over the control socket
// (runscControl: what `runsc pause` does, without the exec; the Sentry
// stops its own tasks, and freezer_linux.go says why it is never frozen
// from outside), with `runsc pause` when that socket cannot be used.
func (o *OCI) Freeze(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	switch o.name {
	case Runc:
		if err := o.freezeCgroup(ctx, id); !errs.Is(err, errs.NotFound) && !errs.Is(err, errs.FailedPrecondition) {
			return err
		}
	case Runsc:
		if done, err := o.runscDirect(ctx, id, runscPause); done {
			return err
		}
	}
	_, err := o.exec(ctx, false, "pause", id, "pause", id)
	return err
}

// runscDirect is runscControl, done=false when the Sentry was not asked
// and the runsc command should be.
func (o *OCI) runscDirect(ctx context.Context, id string, c runscCall) (done bool, err error) {
	err = o.runscControl(ctx, id, c)
	var ns *notSentError
	if errors.As(err, &ns) {
		o.log.Debug("runsc control socket not used; running the runsc command", "op", c.op, "sandbox_id", id, "err", err)
		return false, nil
	}
	return true, err
}

// Thaw resumes a frozen container (runc: the freezer cgroup written
// directly, as `runc resume` does; runsc: the Sentry asked over its
// control socket, as `runsc resume` does).
func (o *OCI) Thaw(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return errs.Field("id", "%q is not a valid id", id)
	}
	switch o.name {
	case Runc:
		if err := o.thawCgroup(ctx, id); !errs.Is(err, errs.NotFound) && !errs.Is(err, errs.FailedPrecondition) {
			return err
		}
	case Runsc:
		if done, err := o.runscDirect(ctx, id, runscResume); done {
			return err
		}
	}
	_, err := o.exec(ctx, false, "resume", id, "resume", id)
	return err
}

// clampRlimits lowers the spec's rlimits to this process's hard limits: the
// sandbox lacks CAP_SYS_RESOURCE, so the runtime cannot raise them and
// refuses to start (runc: "error setting rlimit type 7").
func clampRlimits(cfg *specs.Spec) {
	for i, r := range cfg.Process.Rlimits {
		if r.Type != "RLIMIT_NOFILE" {
			continue
		}
		var cur unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &cur); err != nil {
			continue
		}
		cfg.Process.Rlimits[i].Hard = min(r.Hard, cur.Max)
		cfg.Process.Rlimits[i].Soft = min(r.Soft, cur.Max)
	}
}

// runscCreated reads a container's creation time from runsc's state file
// (<root>/<id>_sandbox:<sandbox>.state): `runsc state` does not report it.
func (o *OCI) runscCreated(id string) time.Time {
	if o.name != Runsc {
		return time.Time{}
	}
	files, _ := filepath.Glob(filepath.Join(o.cfg.Root, id+"_sandbox:*.state"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var c struct {
			CreatedAt time.Time `json:"createdAt"`
		}
		if json.Unmarshal(b, &c) == nil && !c.CreatedAt.IsZero() {
			return c.CreatedAt
		}
	}
	return time.Time{}
}

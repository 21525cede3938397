package daemon

import (
	"context"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// runcUserNS is the host id range root and every other id of a runc sandbox
// map to. One range for all sandboxes (as Docker's userns-remap) rather than
// one per sandbox: layers stay one unshifted copy each, idmapped at mount
// (no shifting copy on create, fork or snapshot), and a memory image fits
// any fork child, since CRIU recreates the mapping it dumped. Sandboxes stay
// apart by their mount, pid, ipc and network namespaces and cgroups; the
// range only has to own nothing on the host, which a range this high does.
var runcUserNS = rootfs.IDMap{HostID: 2000000000, Size: 65536}

// RuncUserNS is the mapping runc sandboxes get unless user namespaces are
// off (Config.NoUserNS); runc's trial checkpoint runs in it too.
func RuncUserNS() rootfs.IDMap { return runcUserNS }

// Attrs.UserNS records on a sandbox the id mapping its workspace was made
// for ("HOST:SIZE"), or sandbox.UserNSNone. A sandbox without it predates
// user namespaces: its workspace holds unshifted ids, and it keeps running
// without one (shifting a workspace on start would cost a walk of it).
const userNSNone = sandbox.UserNSNone

// setupUserNS makes the data dir searchable for the mapped root, which
// runc's init resolves the sandbox's root filesystem path as: the data dir
// and sandboxes/ get the mapped group with search permission only (g=x), so
// a 0700 data dir stays closed to local users. Every directory above the
// data dir must let others search it; if one does not, the daemon says so.
func setupUserNS(cfg Config) (*rootfs.IDMap, error) {
	if cfg.NoUserNS {
		return nil, nil
	}
	m := runcUserNS
	for p := filepath.Dir(filepath.Clean(cfg.DataDir)); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "stat %s", p)
		}
		if st.Mode&0o001 == 0 && !(st.Gid == m.HostID && st.Mode&0o010 != 0) {
			return nil, errs.Field("data_dir", "%s is not searchable by others (mode %o): runc sandboxes in a user namespace cannot reach their root filesystem below it; chmod o+x it, pick another data dir, or run with --no-userns", p, st.Mode&0o7777)
		}
		if p == "/" {
			break
		}
	}
	for _, p := range []string{cfg.DataDir, filepath.Join(cfg.DataDir, "sandboxes")} {
		if err := shareDir(p, 0, m.HostID, 0o710); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

// shareDir gives dir owner uid:gid and the group bits of mode; the owner's
// and others' bits stay as they are (0700 stays closed to others).
func shareDir(dir string, uid, gid uint32, mode os.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "stat %s", dir)
	}
	if err := os.Lchown(dir, int(uid), int(gid)); err != nil {
		return errs.Wrap(errs.Internal, err, "chown %s", dir)
	}
	perm := fi.Mode().Perm()&^0o070 | mode&0o070
	return errs.Wrap(errs.Internal, os.Chmod(dir, perm), "chmod %s", dir)
}

// userNSOf is the mapping sb's workspace was made for; nil: none.
func (d *Daemon) userNSOf(sb *sandbox.Sandbox) *rootfs.IDMap {
	v := sb.UserNS
	if v == "" || v == userNSNone {
		return nil
	}
	m, err := rootfs.ParseIDMap(v)
	if err != nil {
		d.log.Error("bad user namespace on sandbox; running it without", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	return &m
}

// userNSChoice is what a new workspace of runtime gets: the mapping for
// runc (unless disabled), none otherwise.
func (d *Daemon) userNSChoice(runtime string) string {
	if runtime == "runc" && d.userNS != nil {
		return d.userNS.String()
	}
	return userNSNone
}

// presetUserNS records the choice on a sandbox not yet stored (Create).
func (d *Daemon) presetUserNS(sb *sandbox.Sandbox) {
	if sb.UserNS != "" {
		return
	}
	sb.UserNS = d.userNSChoice(sb.Runtime)
}

// pickUserNS decides, before a sandbox's workspace is made, whether it runs
// in a user namespace (runc, unless disabled; a memory fork child already
// carries its parent's choice), and records it before the workspace exists.
func (d *Daemon) pickUserNS(ctx context.Context, sb *sandbox.Sandbox) error {
	if sb.UserNS != "" {
		return nil
	}
	v := d.userNSChoice(sb.Runtime)
	if _, err := d.store.UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		s.UserNS = v
		return nil
	}); err != nil {
		return err
	}
	sb.UserNS = v
	return nil
}

// shareSandboxDir lets the mapped root of a user-namespaced sandbox reach
// its root filesystem (search on the sandbox dir). Its channel dir stays
// root's (0711, socket 0666): the sandbox connects there, never writes.
func (d *Daemon) shareSandboxDir(sb *sandbox.Sandbox) error {
	m := d.userNSOf(sb)
	if m == nil {
		return nil
	}
	return shareDir(d.SandboxDir(sb.ID), 0, m.HostID, 0o710)
}

// runtimeUserNS is the runtime's view of sb's mapping.
func (d *Daemon) runtimeUserNS(sb *sandbox.Sandbox) *runtime.IDMap {
	m := d.userNSOf(sb)
	if m == nil {
		return nil
	}
	return &runtime.IDMap{HostID: m.HostID, Size: m.Size}
}

// Isolation says how sandboxes of a runtime are isolated from the host.
func (d *Daemon) Isolation(runtime string) string {
	switch runtime {
	case "runc":
		if d.userNS != nil {
			return "namespaces+userns+seccomp"
		}
		return "namespaces+seccomp"
	case "runsc":
		return "gVisor"
	}
	return ""
}

// UserNS is the host id range runc sandboxes' ids map to; nil: none.
func (d *Daemon) UserNS() *rootfs.IDMap { return d.userNS }

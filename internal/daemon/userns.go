package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
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

// userNamespaces is the core's runc user-namespace choice: the one host id
// range runc sandboxes map to (nil: none, runsc only or --no-userns), and
// per sandbox the mapping its workspace was made for (Attrs.UserNS). It has
// no lock: the mapping is fixed at New, and a sandbox's record is changed
// only under that sandbox's lock by its caller.
type userNamespaces struct {
	m     *rootfs.IDMap
	store store.Store
	log   *slog.Logger
}

// of is the mapping sb's workspace was made for; nil: none.
func (u *userNamespaces) of(sb *sandbox.Sandbox) *rootfs.IDMap {
	v := sb.UserNS
	if v == "" || v == userNSNone {
		return nil
	}
	m, err := rootfs.ParseIDMap(v)
	if err != nil {
		u.log.Error("bad user namespace on sandbox; running it without", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	return &m
}

// choice is what a new workspace of runtime gets: the mapping for runc
// (unless disabled), none otherwise.
func (u *userNamespaces) choice(runtime string) string {
	if runtime == "runc" && u.m != nil {
		return u.m.String()
	}
	return userNSNone
}

// preset records the choice on a sandbox not yet stored (Create).
func (u *userNamespaces) preset(sb *sandbox.Sandbox) {
	if sb.UserNS != "" {
		return
	}
	sb.UserNS = u.choice(sb.Runtime)
}

// pick decides, before a sandbox's workspace is made, whether it runs in a
// user namespace (runc, unless disabled; a memory fork child already
// carries its parent's choice), and records it before the workspace exists.
func (u *userNamespaces) pick(ctx context.Context, sb *sandbox.Sandbox) error {
	if sb.UserNS != "" {
		return nil
	}
	v := u.choice(sb.Runtime)
	if _, err := u.store.UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		s.UserNS = v
		return nil
	}); err != nil {
		return err
	}
	sb.UserNS = v
	return nil
}

// share lets the mapped root of a user-namespaced sandbox reach its root
// filesystem (search on the sandbox dir, dir). Its channel dir stays
// root's (0711, socket 0666): the sandbox connects there, never writes.
func (u *userNamespaces) share(sb *sandbox.Sandbox, dir string) error {
	m := u.of(sb)
	if m == nil {
		return nil
	}
	return shareDir(dir, 0, m.HostID, 0o710)
}

// forRuntime is the runtime's view of sb's mapping.
func (u *userNamespaces) forRuntime(sb *sandbox.Sandbox) *runtime.IDMap {
	m := u.of(sb)
	if m == nil {
		return nil
	}
	return &runtime.IDMap{HostID: m.HostID, Size: m.Size}
}

// isolation says how sandboxes of a runtime are isolated from the host.
func (u *userNamespaces) isolation(runtime string) string {
	switch runtime {
	case "runc":
		if u.m != nil {
			return "namespaces+userns+seccomp"
		}
		return "namespaces+seccomp"
	case "runsc":
		return "gVisor"
	}
	return ""
}

// Isolation says how sandboxes of a runtime are isolated from the host,
// and the host id range their ids map to (runc with user namespaces; nil
// otherwise).
func (d *Daemon) Isolation(runtime string) (string, *rootfs.IDMap) {
	if runtime != "runc" {
		return d.userns.isolation(runtime), nil
	}
	return d.userns.isolation(runtime), d.userns.m
}

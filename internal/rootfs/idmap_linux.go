package rootfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// userNSFds holds one user namespace per mapping for idmapped mounts: a
// namespace lives as long as an fd refers to it, and mount_setattr only reads
// its mapping, so one per daemon and mapping is enough.
var userNSFds = struct {
	sync.Mutex
	m map[IDMap]int
}{m: map[IDMap]int{}}

// userNSFd returns an fd of a user namespace with mapping m. The kernel makes
// a user namespace only for a new process: a short-lived child is started in
// one (Go writes its uid_map/gid_map before exec), its namespace opened, and
// the child killed.
func userNSFd(m IDMap) (int, error) {
	userNSFds.Lock()
	defer userNSFds.Unlock()
	if fd, ok := userNSFds.m[m]; ok {
		return fd, nil
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "idmapped mounts need a helper process")
	}
	idm := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.HostID), Size: int(m.Size)}}
	cmd := exec.Command(sleep, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER, UidMappings: idm, GidMappings: idm,
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "start a process in a user namespace (%s)", m)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return -1, errs.Wrap(errs.Internal, err, "open user namespace")
	}
	userNSFds.m[m] = fd
	return fd, nil
}

// idmapDir is where a userns sandbox's idmapped lowers are mounted while the
// overlay is set up (the overlay keeps its own references; these go at once).
func idmapDir(l Layout) string { return filepath.Join(l.Dir, "idmap") }

// idmapLowers mounts an idmapped, read-only clone of each lower (same order)
// under idmapDir and returns their paths and an undo that detaches them.
func idmapLowers(l Layout, lowers []string, m IDMap) ([]string, func() error, error) {
	nsfd, err := userNSFd(m)
	if err != nil {
		return nil, nil, err
	}
	base := idmapDir(l)
	undo := func() error { return detachIdmapped(l) }
	// A stale dir (crash between mount and detach) holds nothing we need.
	if err := undo(); err != nil {
		return nil, nil, err
	}
	if err := os.Mkdir(base, 0o700); err != nil {
		return nil, nil, errs.Wrap(errs.Internal, err, "create %s", base)
	}
	out := make([]string, 0, len(lowers))
	for i, lower := range lowers {
		target := filepath.Join(base, strconv.Itoa(i))
		if err := idmapOne(lower, target, nsfd); err != nil {
			return nil, nil, errors.Join(err, undo())
		}
		out = append(out, target)
	}
	return out, undo, nil
}

func idmapOne(src, target string, nsfd int) error {
	if err := os.Mkdir(target, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", target)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open_tree %s", src)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(nsfd),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		kind := errs.Internal
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			kind = errs.Unavailable // the filesystem of the layers cannot be idmapped
		}
		return errs.Wrap(kind, err, "idmap %s", src)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return errs.Wrap(errs.Internal, err, "move_mount %s to %s", src, target)
	}
	return nil
}

// detachIdmapped removes what a crash between the idmapped mounts and the
// overlay left (they are read-only, but a RemoveAll must not meet them).
func detachIdmapped(l Layout) error {
	base := idmapDir(l)
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read %s", base)
	}
	var all []error
	for _, e := range ents {
		p := filepath.Join(base, e.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			all = append(all, errs.Wrap(errs.Internal, err, "unmount %s", p))
		}
	}
	if len(all) == 0 {
		all = append(all, os.RemoveAll(base))
	}
	return errors.Join(all...)
}

// mountRootOverlay mounts the overlay of lowers over l's upper at l.RootFS.
// With m the lowers are idmapped first; the overlay holds private clones of
// its layers, so the idmapped mounts are detached right after.
func mountRootOverlay(l Layout, lowers []string, m *IDMap) error {
	undo := func() error { return nil }
	if m != nil {
		mapped, u, err := idmapLowers(l, lowers, *m)
		if err != nil {
			return err
		}
		lowers, undo = mapped, u
	}
	data, err := overlayData(l, lowers)
	if err != nil {
		return errors.Join(err, undo())
	}
	if err := unix.Mount("overlay", l.RootFS, "overlay", 0, data); err != nil {
		return errors.Join(errs.Wrap(errs.Internal, err, "mount overlay at %s (%s)", l.RootFS, data), undo())
	}
	return undo()
}

// shiftUpperRoot gives a fresh workspace's upper dir to the mapped
// root: the overlay's root directory is the upper's, and root inside must own it.
func shiftUpperRoot(l Layout, m *IDMap) error {
	if m == nil {
		return nil
	}
	if err := os.Lchown(l.Upper, int(m.HostID), int(m.HostID)); err != nil {
		return errs.Wrap(errs.Internal, err, "chown %s", l.Upper)
	}
	return nil
}

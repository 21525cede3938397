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
// overlay is set up, on kernels whose overlayfs cannot take detached mounts
// as layers (the overlay keeps its own references; these go at once).
func idmapDir(l Layout) string { return filepath.Join(l.Dir, "idmap") }

// idmapTrees returns, for each lower (same order), an fd of a detached,
// read-only, nosuid, nodev clone of it that shows its ids through m.
func idmapTrees(lowers []string, m IDMap) ([]int, error) {
	nsfd, err := userNSFd(m)
	if err != nil {
		return nil, err
	}
	fds := make([]int, 0, len(lowers))
	for _, src := range lowers {
		fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			closeAll(fds)
			return nil, errs.Wrap(errs.Internal, err, "open_tree %s", src)
		}
		fds = append(fds, fd)
		attr := &unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(nsfd),
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			closeAll(fds)
			kind := errs.Internal
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
				kind = errs.Unavailable // the filesystem of the layers cannot be idmapped
			}
			return nil, errs.Wrap(kind, err, "idmap %s", src)
		}
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
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

// detachedLayers is false only in the test of the attached fallback.
var detachedLayers = true

// mountRootOverlay mounts the overlay of lowers over l's upper at l.RootFS.
// With m the lowers are idmapped clones, handed to overlayfs as detached
// mounts (/proc/self/fd/N: nothing to mount, move or clean up). A kernel
// that refuses detached layers gets them attached under idmapDir for the
// mount and detached right after; the overlay holds its own references.
func mountRootOverlay(l Layout, lowers []string, m *IDMap) error {
	if m == nil {
		return mountOverlayOf(l, lowers, sandboxMountFlags)
	}
	fds, err := idmapTrees(lowers, *m)
	if err != nil {
		return err
	}
	defer closeAll(fds)
	paths := make([]string, len(fds))
	if detachedLayers {
		for i, fd := range fds {
			paths[i] = "/proc/self/fd/" + strconv.Itoa(fd)
		}
		err = mountOverlayOf(l, paths, userNSOverlayFlags)
		if err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EPERM)) {
			return err
		}
	}
	if err := detachIdmapped(l); err != nil { // a stale dir from a crash
		return err
	}
	base := idmapDir(l)
	if err := os.Mkdir(base, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", base)
	}
	for i, fd := range fds {
		paths[i] = filepath.Join(base, strconv.Itoa(i))
		if err := os.Mkdir(paths[i], 0o700); err != nil {
			return errors.Join(errs.Wrap(errs.Internal, err, "create %s", paths[i]), detachIdmapped(l))
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, paths[i], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return errors.Join(errs.Wrap(errs.Internal, err, "move_mount %s", lowers[i]), detachIdmapped(l))
		}
	}
	return errors.Join(mountOverlayOf(l, paths, userNSOverlayFlags), detachIdmapped(l))
}

func mountOverlayOf(l Layout, lowers []string, flags uintptr) error {
	data, err := overlayData(l, lowers)
	if err != nil {
		return err
	}
	if err := unix.Mount("overlay", l.RootFS, "overlay", flags, data); err != nil {
		return errs.Wrap(errs.Internal, err, "mount overlay at %s (%s)", l.RootFS, data)
	}
	return nil
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

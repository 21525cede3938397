package rootfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/undo"
)

// MinDiskMiB is the smallest workspace image Prepare accepts (ext4 with a
// journal needs a few MiB of metadata).
const MinDiskMiB = 8

// sandboxMountFlags are on every host mount of sandbox content (the
// workspace image, the read-only workspace copy, the overlay of a sandbox
// without a user namespace): a setuid file or device node a sandbox made is
// inert on the host. Inside such a sandbox no-new-privileges ignores setuid
// bits anyway, and /dev is the runtime's own tmpfs.
const sandboxMountFlags = unix.MS_NOSUID | unix.MS_NODEV

// userNSOverlayFlags are the flags of the overlay of a sandbox whose root
// maps to an unprivileged host uid: setuid works there (sudo in the
// template), because the overlay is the sandbox's own root filesystem and a
// setuid bit on it can only raise a process to a uid of that sandbox's
// mapping, never to a host uid outside it (its files are owned by mapped
// uids). The host never executes from it, and only root and the mapped
// root's group may search the sandbox dir above it (userNamespaces.share,
// 0710), so no other host user can reach such a file. The workspace image
// below it stays nosuid: nothing the host reaches through it honours setuid.
const userNSOverlayFlags = unix.MS_NODEV

// Prepare creates the sandbox filesystem in dir: a sparse ext4 image of
// diskMiB, loop-mounted at dir/ws, and an overlay of lowers (first = top)
// under ws/upper mounted at dir/rootfs, whose path it returns. On error
// nothing stays mounted and the image is removed. With idmap the workspace
// is made for a sandbox in that user namespace (see IDMap); nil: unshifted.
func Prepare(ctx context.Context, dir string, lowers []string, diskMiB int64, idmap *IDMap) (string, error) {
	return (*Spares)(nil).Prepare(ctx, dir, lowers, diskMiB, idmap)
}

// Prepare is Prepare taking a spare image of diskMiB when spares (which
// may be nil) has one ready.
func (spares *Spares) Prepare(ctx context.Context, dir string, lowers []string, diskMiB int64, idmap *IDMap) (string, error) {
	if diskMiB < MinDiskMiB {
		return "", errs.Field("disk_mib", "must be at least %d, got %d", MinDiskMiB, diskMiB)
	}
	l := LayoutOf(dir)
	if _, err := overlayData(l, lowers); err != nil { // validate before any effect
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", errs.Wrap(errs.Unavailable, err, "prepare %s", dir)
	}
	if err := os.MkdirAll(l.WS, 0o700); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create sandbox dir")
	}
	var cleanup undo.Stack
	fail := func(err error) (string, error) {
		return "", errors.Join(err, cleanup.Run(ctx))
	}

	// The image is made under a scratch name and renamed into place once
	// formatted: a daemon killed during mkfs must not leave a disk.img
	// that its next start takes for a workspace and cannot mount (EIO).
	// A spare (Spares) is such an image made ahead of time.
	if _, err := os.Lstat(l.Image); err == nil {
		return "", errs.E(errs.AlreadyExists, "%s already exists (use Remount)", l.Image)
	}
	scratch := l.Image + ".new"
	if err := ignoreNotExist(os.Remove(scratch)); err != nil { // an earlier crash's, spare or not
		return "", errs.Wrap(errs.Internal, err, "remove %s", scratch)
	}
	placed, mnt := spares.take(l.Image, diskMiB)
	if !placed {
		if err := formatImage(ctx, scratch, diskMiB); err != nil {
			return fail(err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, scratch, unix.AT_FDCWD, l.Image, unix.RENAME_NOREPLACE); err != nil {
			_ = os.Remove(scratch)
			if errors.Is(err, unix.EEXIST) {
				return fail(errs.E(errs.AlreadyExists, "%s already exists (use Remount)", l.Image))
			}
			return fail(errs.Wrap(errs.Internal, err, "put disk image in place"))
		}
	}
	cleanup.Push(func(context.Context) error { return ignoreNotExist(os.Remove(l.Image)) })
	if err := attachWS(ctx, l, mnt); err != nil {
		return fail(err)
	}
	cleanup.Push(func(context.Context) error { return unmount(l.WS) })
	if err := mkdirsIn(l); err != nil {
		return fail(err)
	}
	if err := shiftUpperRoot(l, idmap); err != nil {
		return fail(err)
	}
	if err := mountRootOverlay(l, lowers, idmap); err != nil {
		return fail(err)
	}
	return l.RootFS, nil
}

// Remount brings back the mounts of a prepared dir whose image survived but
// whose mounts did not (host reboot). Mounts already present are kept.
// idmap must be what the workspace was prepared with.
func Remount(ctx context.Context, dir string, lowers []string, idmap *IDMap) (string, error) {
	l := LayoutOf(dir)
	if _, err := overlayData(l, lowers); err != nil { // validate before any effect
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", errs.Wrap(errs.Unavailable, err, "remount %s", dir)
	}
	if _, err := os.Stat(l.Image); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", errs.E(errs.NotFound, "no disk image at %s", l.Image)
		}
		return "", errs.Wrap(errs.Internal, err, "stat disk image")
	}
	wsMounted := isMountPoint(l.WS)
	if !wsMounted {
		// The image may still be mounted through a dying sandbox's mount
		// namespace; a second loop device on it would corrupt the workspace.
		if err := waitDetached(ctx, l.Image, detachTimeout); err != nil {
			return "", err
		}
		if err := os.MkdirAll(l.WS, 0o700); err != nil {
			return "", errs.Wrap(errs.Internal, err, "create %s", l.WS)
		}
		if err := mountWS(l); err != nil {
			return "", err
		}
	}
	if isMountPoint(l.RootFS) {
		return l.RootFS, nil
	}
	if err := mkdirsIn(l); err != nil {
		return "", err
	}
	if err := mountRootOverlay(l, lowers, idmap); err != nil {
		if !wsMounted {
			err = errors.Join(err, unmount(l.WS))
		}
		return "", err
	}
	return l.RootFS, nil
}

// Teardown unmounts the overlay and the workspace image and detaches the
// loop device. It keeps disk.img (the workspace), is idempotent, and joins
// the errors of every step.
func Teardown(ctx context.Context, dir string) error {
	l := LayoutOf(dir)
	var all []error
	if err := unmount(l.RootFS); err != nil {
		all = append(all, err)
	}
	// What else is mounted in dir was left by a crash mid-setup (idmapped
	// layers, the runtime's sysfs for a sandbox): never let a RemoveAll of
	// the dir meet it.
	if err := detachOthers(l); err != nil {
		all = append(all, err)
	}
	if err := detachIdmapped(l); err != nil {
		all = append(all, err)
	}
	// The workspace's own device, read before the unmount: its autoclear
	// detaches it once the last mount (maybe in a dying sandbox's mount
	// namespace) is gone, and only it needs watching.
	wsLoop := loopNamed(mountedDevice(l.WS))
	if err := unmount(l.WS); err != nil {
		all = append(all, err)
	}
	if wsLoop == "" {
		// Not mounted here: a crash between attach and mount may have left
		// a device on the image; look at every one.
		if err := detachLoops(l.Image); err != nil {
			all = append(all, err)
		}
	}
	if len(all) == 0 {
		// Teardown returns only once nothing holds the workspace, so the
		// next mount of the image is the only one.
		var err error
		if wsLoop != "" {
			err = waitLoopFree(ctx, wsLoop, l.Image, detachTimeout)
		} else {
			err = waitDetached(ctx, l.Image, detachTimeout)
		}
		if err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// Mounted reports whether dir's overlay root is mounted.
func Mounted(dir string) bool { return isMountPoint(LayoutOf(dir).RootFS) }

// mkdirsIn creates the overlay's directories on the mounted workspace. The
// upper dir's mode is the sandbox's "/" (0755, so its users can traverse
// it); everything the host keeps around it is 0700, so no host user
// reaches sandbox content.
func mkdirsIn(l Layout) error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{l.WS, 0o700}, {l.Upper, 0o755}, {l.Work, 0o700}, {l.RootFS, 0o700}} {
		if err := os.Mkdir(d.path, d.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return errs.Wrap(errs.Internal, err, "create %s", d.path)
		}
		if d.path == l.WS || d.path == l.Work {
			// The ext4 root is made 0755 by mkfs; MkdirAll left an
			// existing dir's mode as it was.
			if err := os.Chmod(d.path, d.mode); err != nil {
				return errs.Wrap(errs.Internal, err, "chmod %s", d.path)
			}
		}
	}
	return nil
}

// attachWS puts the workspace image at l.WS: a spare's detached mount (mnt
// ≥ 0, which it closes) is moved there; with none, or if the move fails,
// the image is mounted (once the spare's own device has gone).
func attachWS(ctx context.Context, l Layout, mnt int) error {
	if mnt < 0 {
		return mountWS(l)
	}
	err := unix.MoveMount(mnt, "", unix.AT_FDCWD, l.WS, unix.MOVE_MOUNT_F_EMPTY_PATH)
	_ = unix.Close(mnt)
	if err == nil {
		return nil
	}
	if werr := waitDetached(ctx, l.Image, detachTimeout); werr != nil {
		return errors.Join(errs.Wrap(errs.Internal, err, "move the spare workspace to %s", l.WS), werr)
	}
	return mountWS(l)
}

func mountWS(l Layout) error {
	dev, err := attachLoop(l.Image, false)
	if err != nil {
		return err
	}
	// Closing our descriptor after the mount leaves the mount as the only
	// user; autoclear then detaches the device at unmount.
	defer dev.Close()
	if err := unix.Mount(dev.Name(), l.WS, "ext4", sandboxMountFlags|unix.MS_NOATIME, wsMountData); err != nil {
		return errs.Wrap(errs.Internal, err, "mount %s (%s) at %s", dev.Name(), l.Image, l.WS)
	}
	return nil
}

// unmount unmounts path, treating "not mounted" and "missing" as done. A
// busy mount is retried briefly: a container that just died may still hold
// it for a few milliseconds.
func unmount(path string) error {
	var err error
	for i := 0; i < 50; i++ {
		err = unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			if !isMountPoint(path) {
				return nil
			}
			continue // stacked mounts: unmount the next one too
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	kind := errs.Internal
	if errors.Is(err, unix.EBUSY) {
		kind = errs.Conflict
	}
	return errs.Wrap(kind, err, "unmount %s", path)
}

// detachOthers lazily unmounts every mount below l.Dir but the workspace
// and the overlay root, deepest first.
func detachOthers(l Layout) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read mountinfo")
	}
	prefix := filepath.Clean(l.Dir) + "/"
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountinfo(fields[4])
		if strings.HasPrefix(p, prefix) && p != l.WS && p != l.RootFS && !strings.HasPrefix(p, l.WS+"/") && !strings.HasPrefix(p, l.RootFS+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var all []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			all = append(all, errs.Wrap(errs.Internal, err, "unmount %s", p))
		}
	}
	return errors.Join(all...)
}

// isMountPoint reports whether path is a mount point in this mount namespace.
func isMountPoint(path string) bool { return mountedDevice(path) != "" }

// IsMountPoint reports whether a host-owned path is the root of a mount in
// this mount namespace (its last element is not followed).
func IsMountPoint(path string) bool { return isMountPoint(path) }

// mountedDevice is the major:minor of the filesystem mounted at path in
// this mount namespace (the last mount there), or "" if none is. path is
// one of the host-owned mount points of a sandbox dir (its last element is
// not followed). statx's mount-root attribute answers in one call;
// mountinfo, read where the kernel lacks it, grows with every sandbox's
// mounts and was read several times per create and delete.
func mountedDevice(path string) string {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_TYPE, &st)
	switch {
	case err != nil:
		return ""
	case st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0: // before Linux 5.8
		return mountinfoDevice(path)
	case st.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0:
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev_major, st.Dev_minor)
}

// mountinfoDevice is mountedDevice read from /proc/self/mountinfo.
func mountinfoDevice(path string) string {
	path = filepath.Clean(path)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	dev := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == path {
			dev = fields[2]
		}
	}
	return dev
}

// unescapeMountinfo undoes the kernel's octal escaping of space, tab,
// newline and backslash in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		kind := errs.Internal
		if errors.Is(err, exec.ErrNotFound) {
			kind = errs.Unavailable
		}
		return errs.Wrap(kind, err, "%s %s: %s", name, strings.Join(args, " "), tail(out.String(), 2048))
	}
	return nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

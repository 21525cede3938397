package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// MountWorkspaceReadOnly mounts the workspace image of the sandbox
// directory dir read-only at dir/ro, for reading the upper of a sandbox
// whose workspace is not mounted (stopped, paused to memory or disk): a
// read-only loop device, ext4 with noload (no journal replay: nothing is
// written), nosuid, nodev, noexec. The caller holds the sandbox's lock for
// as long as the mount lives, so nothing else mounts the image meanwhile
// (two loop devices on one image are refused here, as every mount does).
// It returns the upper dir in the mount and the undo step, which unmounts
// and waits for the loop device to detach.
func MountWorkspaceReadOnly(ctx context.Context, dir string) (upper string, release func() error, err error) {
	l := LayoutOf(dir)
	if isMountPoint(l.WS) || isMountPoint(l.RootFS) {
		return "", nil, errs.E(errs.FailedPrecondition, "the workspace of %s is mounted", dir)
	}
	if devs := attachedLoops(l.Image); len(devs) > 0 {
		return "", nil, errs.E(errs.Unavailable, "workspace image %s is attached to %s", l.Image, strings.Join(devs, ","))
	}
	mnt := filepath.Join(dir, "ro")
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", nil, errs.Wrap(errs.Internal, err, "create %s", mnt)
	}
	if isMountPoint(mnt) { // left by a crash
		if err := unix.Unmount(mnt, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return "", nil, errs.Wrap(errs.Internal, err, "unmount stale %s", mnt)
		}
	}
	dev, err := attachLoop(l.Image, true)
	if err != nil {
		return "", nil, err
	}
	err = unix.Mount(dev.Name(), mnt, "ext4", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_NOATIME, "noload")
	dev.Close() // the mount holds the device; autoclear detaches it at unmount
	if err != nil {
		return "", nil, errs.Wrap(errs.Internal, err, "mount %s read-only at %s", l.Image, mnt)
	}
	release = func() error {
		if err := unmount(mnt); err != nil {
			return err
		}
		_ = os.Remove(mnt)
		return waitDetached(context.WithoutCancel(ctx), l.Image, detachTimeout)
	}
	return filepath.Join(mnt, "upper"), release, nil
}

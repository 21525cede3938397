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
	dev, err := attachLoopReadOnly(l.Image)
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

// attachLoopReadOnly is attachLoop for a read-only device.
func attachLoopReadOnly(image string) (*os.File, error) {
	img, err := os.OpenFile(image, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "open disk image")
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "open /dev/loop-control")
	}
	defer ctl.Close()
	for attempt := 0; attempt < 16; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, errs.Wrap(errs.ResourceExhausted, err, "find free loop device")
		}
		dev, err := openLoopDev(n)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_READ_ONLY
		copy(cfg.Info.File_name[:], filepath.Base(image))
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			dev.Close()
			continue
		}
		if err != nil {
			dev.Close()
			return nil, errs.Wrap(errs.Internal, err, "configure %s for %s", dev.Name(), image)
		}
		return dev, nil
	}
	return nil, errs.E(errs.Unavailable, "no loop device could be configured for %s (busy)", image)
}

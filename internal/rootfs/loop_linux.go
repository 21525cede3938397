package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// attachLoop binds image to a free loop device with LOOP_CONFIGURE (one
// ioctl instead of losetup's SET_FD+SET_STATUS) and returns the open device.
// The device is autoclear: it detaches itself when the last user (the ext4
// mount) goes away, so Teardown only has to unmount. A readOnly device
// (a diff of a stopped sandbox's workspace) is opened and bound read-only
// and buffered.
func attachLoop(image string, readOnly bool) (*os.File, error) {
	mode, flags := os.O_RDWR, uint32(unix.LO_FLAGS_AUTOCLEAR|unix.LO_FLAGS_DIRECT_IO)
	if readOnly {
		mode, flags = os.O_RDONLY, unix.LO_FLAGS_AUTOCLEAR|unix.LO_FLAGS_READ_ONLY
	}
	img, err := os.OpenFile(image, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		if readOnly {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "open disk image")
		}
		return nil, errs.Wrap(errs.Internal, err, "open disk image")
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "open /dev/loop-control")
	}
	defer ctl.Close()

	// Another process may take the free device between GET_FREE and
	// CONFIGURE; that shows as EBUSY and we ask again.
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
		cfg.Info.Flags = flags
		if flags&unix.LO_FLAGS_DIRECT_IO != 0 {
			cfg.Size = 4096
		}
		copy(cfg.Info.File_name[:], filepath.Base(image))
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) && cfg.Info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
			// Backing file system without O_DIRECT: fall back to buffered I/O.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			cfg.Size = 0
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
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

func openLoopDev(n int) (*os.File, error) {
	path := fmt.Sprintf("/dev/loop%d", n)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		// /dev without devtmpfs: make the node ourselves.
		if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, errs.Wrap(errs.Internal, err, "mknod %s", path)
		}
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "open %s", path)
	}
	return f, nil
}

// detachTimeout bounds how long a workspace image may stay attached after
// its last mount is gone in this namespace (a killed sandbox's mount
// namespace can outlive `runc delete` by a few milliseconds).
const detachTimeout = 10 * time.Second

// attachedLoops lists the loop devices backed by image. It reads each
// device's backing_file directly (an unbound device has no loop/ dir):
// a glob of /sys/block/loop*/loop/backing_file costs two more lstats per
// device, ~30 ms on a host with a thousand of them.
func attachedLoops(image string) []string {
	ents, _ := os.ReadDir("/sys/block")
	var out []string
	for _, e := range ents {
		if name := e.Name(); strings.HasPrefix(name, "loop") && backedBy(name, image) {
			out = append(out, name)
		}
	}
	return out
}

// backedBy reports whether loop device name (loopN) is backed by image.
func backedBy(name, image string) bool {
	b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	return err == nil && strings.TrimSuffix(string(b), "\n") == image
}

// loopNamed is the loop device (loopN) whose major:minor is dev, or "" if
// dev is not a loop device.
func loopNamed(dev string) string {
	target, err := os.Readlink("/sys/dev/block/" + dev)
	if err != nil {
		return ""
	}
	if name := filepath.Base(target); strings.HasPrefix(name, "loop") {
		return name
	}
	return ""
}

// waitDetached waits until no loop device is backed by image. Mounting an
// ext4 image through two loop devices at once corrupts it, so this is the
// guard every (re)mount passes.
func waitDetached(ctx context.Context, image string, limit time.Duration) error {
	return waitFree(ctx, image, limit, 50*time.Millisecond, func() []string { return attachedLoops(image) })
}

// waitLoopFree waits until loop device name no longer holds image: the
// teardown of a workspace it mounted knows its device, so it polls that
// one file, not every device on the host.
func waitLoopFree(ctx context.Context, name, image string, limit time.Duration) error {
	return waitFree(ctx, image, limit, 4*time.Millisecond, func() []string {
		if backedBy(name, image) {
			return []string{name}
		}
		return nil
	})
}

// waitFree polls attached, backing off up to maxDelay, until it lists no
// device or limit has passed.
func waitFree(ctx context.Context, image string, limit, maxDelay time.Duration, attached func() []string) error {
	deadline := time.Now().Add(limit)
	delay := time.Millisecond
	for {
		devs := attached()
		if len(devs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errs.E(errs.Unavailable, "workspace image %s is still attached to %s after %s (still mounted in another mount namespace?)", image, strings.Join(devs, ","), limit)
		}
		select {
		case <-ctx.Done():
			return errs.Wrap(errs.Unavailable, ctx.Err(), "waiting for %s to detach", image)
		case <-time.After(delay):
		}
		delay = min(delay*2, maxDelay)
	}
}

// detachLoops clears every loop device still backed by image. Normally there
// is none (autoclear); this catches devices left by a crash between attach
// and mount, or attached by hand.
func detachLoops(image string) error {
	var all []error
	for _, name := range attachedLoops(image) {
		f, err := os.OpenFile("/dev/"+name, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			all = append(all, errs.Wrap(errs.Internal, err, "open /dev/%s", name))
			continue
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.ENXIO) {
			all = append(all, errs.Wrap(errs.Internal, err, "detach /dev/%s from %s", name, image))
		}
	}
	return errors.Join(all...)
}

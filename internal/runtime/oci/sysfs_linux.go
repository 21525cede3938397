package oci

import (
	"errors"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
)

// hostSysfs mounts, for a spec that needs it (needsHostSysfs), a read-only
// sysfs of the sandbox's network namespace at SysfsDir for the runtime to
// bind in. The returned func detaches it once the runtime has started the
// sandbox: the sandbox's bind keeps its own reference, and nothing is left
// on the host to tear down.
func hostSysfs(spec runtime.Spec) (func() error, error) {
	if !needsHostSysfs(spec) {
		return func() error { return nil }, nil
	}
	dir := SysfsDir(spec.BundleDir)
	detach := func() error {
		err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return errs.Wrap(errs.Internal, err, "unmount %s", dir)
		}
		return nil
	}
	if err := detach(); err != nil { // left by a crash
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "create %s", dir)
	}
	// Its own goroutine: a thread that cannot switch back dies with it.
	res := make(chan error, 1)
	go func() {
		res <- inNetns(spec.NetNSPath, func() error {
			return unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		})
	}()
	if err := <-res; err != nil {
		return nil, errs.Wrap(errs.Internal, err, "mount sysfs of %s", spec.NetNSPath)
	}
	return detach, nil
}

// inNetns runs fn on an OS thread switched into the network namespace at path.
func inNetns(path string, fn func() error) error {
	goruntime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open(path)
	if err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, err) // the thread stays locked and dies with its goroutine
	}
	goruntime.UnlockOSThread()
	return ferr
}

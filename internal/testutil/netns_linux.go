package testutil

import (
	"errors"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetns runs fn on an OS thread switched into the network namespace at
// path; sockets fn creates stay in that namespace (tests use it to serve
// their own "internet" hosts inside namespaces they made).
func InNetns(path string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, err) // the thread stays locked and dies with its goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

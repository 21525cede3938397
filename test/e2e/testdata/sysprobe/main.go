// sysprobe makes one syscall named by its argument and prints "ok" or the
// errno's name: the e2e seccomp test runs it inside a sandbox as root to
// attack the filter. A syscall of an ABI the filter does not list kills the
// calling thread (seccomp's bad-arch action): a watchdog goroutine then
// prints "killed" and exits the process.
package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// x32Bit marks a syscall number of the x32 ABI on x86_64.
const x32Bit = 0x40000000

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sysprobe getpid|x32-getpid|vsock|unshare-user")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(2) // the probe's thread may die holding its P
	go func() {
		time.Sleep(2 * time.Second)
		fmt.Println("killed")
		os.Exit(0)
	}()
	var errno syscall.Errno
	switch os.Args[1] {
	case "getpid":
		_, _, errno = syscall.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
	case "x32-getpid":
		// Syscall, not RawSyscall: it hands its P over while in the kernel.
		_, _, errno = syscall.Syscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
	case "vsock":
		var fd uintptr
		fd, _, errno = syscall.RawSyscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		if errno == 0 {
			syscall.Close(int(fd))
		}
	case "unshare-user":
		_, _, errno = syscall.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)
	default:
		fmt.Fprintln(os.Stderr, "sysprobe: unknown probe", os.Args[1])
		os.Exit(2)
	}
	if errno != 0 {
		fmt.Println(unix.ErrnoName(errno))
		return
	}
	fmt.Println("ok")
}

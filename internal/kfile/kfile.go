// Package kfile reads the small files the kernel generates (cgroupfs,
// procfs) that the daemon polls for every sandbox: one open, read and close
// each, on a caller's buffer. os.ReadFile also registers the file with the
// runtime's poller (an epoll_ctl the kernel refuses for these files) and
// stats it first; at 1,000 sandboxes those polls were most of an idle
// daemon's CPU. Only for host-owned kernel files: nothing here resolves a
// path safely against a sandbox-writable tree.
package kfile

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrTooLarge: the file did not fit the buffer.
var ErrTooLarge = errors.New("kernel file larger than its buffer")

// Read reads the whole file at path into buf and returns the part read.
// A file that does not fit is ErrTooLarge: these files are read whole, as
// the kernel generates them at the first read.
func Read(path string, buf []byte) ([]byte, error) {
	fd, err := open(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			return nil, fmt.Errorf("%s: %w (%d bytes)", path, ErrTooLarge, len(buf))
		}
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &pathError{"read", path, err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

func open(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &pathError{"open", path, err}
		}
		return fd, nil
	}
}

// pathError is an *os.PathError's text with the errno kept for errors.Is
// (os.ErrNotExist and the like match through unix.Errno).
type pathError struct {
	op, path string
	err      error
}

func (e *pathError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// Uint reads a file holding one unsigned decimal number (cpuacct.usage,
// memory.usage_in_bytes, pids.current).
func Uint(path string) (uint64, error) {
	var b [64]byte
	got, err := Read(path, b[:])
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(got)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// Keyed reads the value of key from a file of "key value" lines
// (memory.oom_control, cpu.stat); a key the file lacks is 0.
func Keyed(path, key string) (uint64, error) {
	var b [4096]byte
	got, err := Read(path, b[:])
	if err != nil {
		return 0, err
	}
	for len(got) > 0 {
		line := got
		if i := bytes.IndexByte(got, '\n'); i >= 0 {
			line, got = got[:i], got[i+1:]
		} else {
			got = nil
		}
		k, v, ok := bytes.Cut(line, []byte{' '})
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", path, key, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

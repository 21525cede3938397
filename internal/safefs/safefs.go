// Package safefs opens files inside trees a sandbox can write (its rootfs,
// its overlay upper dir) without ever following a path the sandbox chose.
//
// Every path is resolved beneath a root directory with openat2(2)
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV:
// a symlink anywhere on the path (absolute, relative, in an intermediate
// component or the last one), a ".." leaving the root or a mount crossing
// fails instead of leading the host somewhere else. Only regular files are
// opened: an existing entry is first opened O_PATH (which never opens the
// inode itself), checked with fstat, and only then reopened through
// /proc/self/fd, so a device node or a FIFO planted at the path is never
// opened (no blocking open, no device side effect).
package safefs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// ErrRefused is wrapped by every error for a path that goes through a
// symlink, leaves the root, crosses a mount, or names something other than
// what was asked for (a device node, a FIFO, a socket, a directory).
var ErrRefused = errors.New("refused: not a plain path beneath the root")

const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Root is an open directory that paths are resolved beneath. The root's
// own path is trusted (the host made it); everything below it is not.
type Root struct {
	fd   int
	name string
}

// OpenRoot opens dir as a root. dir itself may not be a symlink.
func OpenRoot(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, &os.PathError{Op: "open root", Path: dir, Err: err}, "safefs")
	}
	return &Root{fd: fd, name: dir}, nil
}

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Name is the root's host path.
func (r *Root) Name() string { return r.name }

// clean makes name relative to the root ("/etc/x" and "etc/x" are the same
// file) and refuses ".." components outright.
func clean(name string) (string, error) {
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", refused(name, "has a \"..\" component")
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

func refused(name, why string) error {
	return errs.Wrap(errs.PermissionDenied, fmt.Errorf("%w", ErrRefused), "path %q %s", name, why)
}

// pathErr turns openat2's answers for a hostile path into ErrRefused.
func pathErr(op, name string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return refused(name, "goes through a symlink")
	case errors.Is(err, unix.EXDEV):
		return refused(name, "leaves the root or crosses a mount")
	case errors.Is(err, unix.ENOENT):
		return errs.Wrap(errs.NotFound, &os.PathError{Op: op, Path: name, Err: os.ErrNotExist}, "safefs")
	case errors.Is(err, unix.EEXIST):
		return errs.Wrap(errs.AlreadyExists, &os.PathError{Op: op, Path: name, Err: os.ErrExist}, "safefs")
	case errors.Is(err, unix.ENOTDIR):
		return refused(name, "has a component that is not a directory")
	}
	return errs.Wrap(errs.Internal, &os.PathError{Op: op, Path: name, Err: err}, "safefs")
}

func (r *Root) openat2(rel string, flags uint64, mode uint64) (int, error) {
	for {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: mode, Resolve: resolve})
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue // a concurrent rename elsewhere on the path; try again
		}
		return fd, err
	}
}

// Open opens the regular file name beneath r for reading.
func (r *Root) Open(name string) (*os.File, error) { return r.OpenFile(name, os.O_RDONLY, 0) }

// OpenFile opens the regular file name beneath r. With os.O_CREATE a
// missing file is created with perm (an existing one must be a regular
// file; with os.O_EXCL it may not exist). Anything but a regular file is
// refused without being opened.
func (r *Root) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	rel, err := clean(name)
	if err != nil {
		return nil, err
	}
	create, excl := flag&os.O_CREATE != 0, flag&os.O_EXCL != 0
	for attempt := 0; attempt < 4; attempt++ {
		if !excl {
			f, err := r.reopenRegular(name, rel, flag&^(os.O_CREATE|os.O_EXCL))
			if err == nil || !create || !errs.Is(err, errs.NotFound) {
				return f, err
			}
		}
		fd, err := r.openat2(rel, uint64(flag|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NOCTTY), uint64(perm.Perm()))
		if errors.Is(err, unix.EEXIST) && !excl {
			continue // made between our two looks; open what is there
		}
		if err != nil {
			return nil, pathErr("create", name, err)
		}
		return os.NewFile(uintptr(fd), path.Join(r.name, rel)), nil
	}
	return nil, errs.E(errs.Conflict, "path %q keeps changing under the host", name)
}

// reopenRegular opens an existing rel O_PATH, checks it is a regular file,
// and reopens that very inode with flag.
func (r *Root) reopenRegular(name, rel string, flag int) (*os.File, error) {
	pfd, err := r.openat2(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, pathErr("stat", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, refused(name, "is not a regular file ("+typeName(st.Mode)+")")
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flag|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	// O_NONBLOCK only mattered for the open; a regular file ignores it,
	// but drop it so the descriptor behaves as callers expect.
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return os.NewFile(uintptr(fd), path.Join(r.name, rel)), nil
}

// OpenDir opens the directory name beneath r (read-only, usable as the dirfd
// of *at calls).
func (r *Root) OpenDir(name string) (*os.File, error) {
	rel, err := clean(name)
	if err != nil {
		return nil, err
	}
	fd, err := r.openat2(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, pathErr("open dir", name, err)
	}
	return os.NewFile(uintptr(fd), path.Join(r.name, rel)), nil
}

// Lstat reports what is at name without following it (intermediate
// components may not be symlinks either).
func (r *Root) Lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	rel, err := clean(name)
	if err != nil {
		return st, err
	}
	pfd, err := r.openat2(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, pathErr("stat", name, err)
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return st, pathErr("stat", name, err)
	}
	return st, nil
}

// ReadFile reads the regular file name beneath r, refusing one larger than
// max bytes.
func (r *Root) ReadFile(name string, max int64) ([]byte, error) {
	f, err := r.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read %q", name)
	}
	if int64(len(b)) > max {
		return nil, errs.E(errs.ResourceExhausted, "file %q is larger than %d bytes", name, max)
	}
	return b, nil
}

// WriteFile replaces name beneath r with data: it writes a fresh temporary
// file next to it and renames it over whatever was at name, so a symlink,
// device node or FIFO planted there is replaced, never followed or opened.
// The parent directory must exist (and be reached without symlinks).
func (r *Root) WriteFile(name string, data []byte, perm os.FileMode) error {
	rel, err := clean(name)
	if err != nil {
		return err
	}
	if rel == "." {
		return refused(name, "is the root")
	}
	dir, err := r.OpenDir(path.Dir(rel))
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	base := path.Base(rel)
	var tmp string
	var fd int
	for i := 0; ; i++ {
		tmp = ".berth-" + base + "." + strconv.Itoa(os.Getpid()) + "." + strconv.Itoa(i) + ".tmp"
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if errors.Is(err, unix.EEXIST) && i < 100 {
			continue
		}
		break
	}
	if err != nil {
		return pathErr("create", name, err)
	}
	f := os.NewFile(uintptr(fd), path.Join(r.name, rel))
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm.Perm()) // exact mode despite the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return errs.Wrap(errs.Internal, err, "write %q", name)
	}
	return nil
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "unknown type"
}

// Open opens the regular file name beneath root for reading.
func Open(root, name string) (*os.File, error) {
	r, err := OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Open(name)
}

// OpenFile is Root.OpenFile on a root opened for the one call.
func OpenFile(root, name string, flag int, perm os.FileMode) (*os.File, error) {
	r, err := OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.OpenFile(name, flag, perm)
}

// ReadFile is Root.ReadFile on a root opened for the one call.
func ReadFile(root, name string, max int64) ([]byte, error) {
	r, err := OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadFile(name, max)
}

// WriteFile is Root.WriteFile on a root opened for the one call.
func WriteFile(root, name string, data []byte, perm os.FileMode) error {
	r, err := OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.WriteFile(name, data, perm)
}

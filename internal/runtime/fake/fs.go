package fake

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
)

// Dirs is a plain-directory stand-in for internal/rootfs, for tests that
// run without root: Prepare makes the sandbox directory's workspace marker
// (disk.img, a sparse file of the disk size) and an empty rootfs/ that is
// "mounted" until Teardown. Nothing is mounted and the lowers are only
// checked, never read. The zero value is ready to use.
type Dirs struct {
	mu      sync.Mutex
	mounted map[string][]string // sandbox dir -> lowers
}

// Prepare creates a fresh workspace in dir over lowers and mounts it.
func (f *Dirs) Prepare(ctx context.Context, dir string, lowers []string, diskMiB int64, idmap *rootfs.IDMap) (string, error) {
	if diskMiB < rootfs.MinDiskMiB {
		return "", errs.Field("disk_mib", "must be at least %d, got %d", rootfs.MinDiskMiB, diskMiB)
	}
	if err := checkLowers(lowers); err != nil {
		return "", err
	}
	l := rootfs.LayoutOf(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create %s", dir)
	}
	img, err := os.OpenFile(l.Image, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", errs.E(errs.AlreadyExists, "workspace %s already exists", l.Image)
		}
		return "", errs.Wrap(errs.Internal, err, "create workspace")
	}
	err = img.Truncate(diskMiB << 20)
	if cerr := img.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "size workspace")
	}
	return f.mount(l, lowers)
}

// Remount mounts the existing workspace in dir again over lowers.
func (f *Dirs) Remount(ctx context.Context, dir string, lowers []string, idmap *rootfs.IDMap) (string, error) {
	if err := checkLowers(lowers); err != nil {
		return "", err
	}
	l := rootfs.LayoutOf(dir)
	if _, err := os.Stat(l.Image); err != nil {
		return "", errs.Wrap(errs.NotFound, err, "workspace of %s", dir)
	}
	return f.mount(l, lowers)
}

func (f *Dirs) mount(l rootfs.Layout, lowers []string) (string, error) {
	if err := os.MkdirAll(l.Upper, 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create %s", l.Upper)
	}
	if err := os.MkdirAll(l.RootFS, 0o700); err != nil {
		return "", errs.Wrap(errs.Internal, err, "create %s", l.RootFS)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mounted == nil {
		f.mounted = map[string][]string{}
	}
	f.mounted[filepath.Clean(l.Dir)] = append([]string(nil), lowers...)
	return l.RootFS, nil
}

// Teardown "unmounts" dir's root filesystem, keeping the workspace. Idempotent.
func (f *Dirs) Teardown(ctx context.Context, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mounted, filepath.Clean(dir))
	return nil
}

// Mounted reports whether dir's root filesystem is mounted, and over which lowers.
func (f *Dirs) Mounted(dir string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.mounted[filepath.Clean(dir)]
	return l, ok
}

// MountedCount is how many sandbox root filesystems are mounted.
func (f *Dirs) MountedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mounted)
}

func checkLowers(lowers []string) error {
	if len(lowers) == 0 {
		return errs.Field("lowers", "at least one lower layer is required")
	}
	for i, p := range lowers {
		if !filepath.IsAbs(p) {
			return errs.Field("lowers", "path %d (%q) is not absolute", i, p)
		}
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return errs.E(errs.FailedPrecondition, "lower %q is not a directory", p)
		}
	}
	return nil
}

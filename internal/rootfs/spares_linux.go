package rootfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// Spares keeps formatted workspace images of one size ready in a host-only
// directory, so that a fresh workspace of that size is a rename instead of
// an mkfs.ext4 run (6 of the 9 ms a workspace took on the reference host:
// the process and its writes). An image here was made by this process's
// mkfs and seen by no sandbox; taking one moves it out of the directory, so
// none is ever handed out twice. Each is ~1.2 MiB on disk (sparse).
type Spares struct {
	dir  string
	mib  int64
	keep int
	log  *slog.Logger
	wake chan struct{}

	mu    sync.Mutex
	ready []string // formatted images, oldest first
}

const spareExt = ".img"

// NewSpares opens (making it 0700) dir as the spare images of mib MiB, up
// to keep of them. Images of another size and leftovers of an interrupted
// mkfs are removed; the formatted ones of that size are kept.
func NewSpares(dir string, mib int64, keep int, log *slog.Logger) (*Spares, error) {
	if mib < MinDiskMiB {
		return nil, errs.Field("disk_mib", "must be at least %d, got %d", MinDiskMiB, mib)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "create %s", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "chmod %s", dir)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Spares{dir: dir, mib: mib, keep: keep, log: log, wake: make(chan struct{}, 1)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read %s", dir)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if s.usable(e.Name()) && len(s.ready) < keep {
			s.ready = append(s.ready, p)
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, errs.Wrap(errs.Internal, err, "remove %s", p)
		}
	}
	return s, nil
}

// usable says whether name in s.dir is a finished image of s's size.
func (s *Spares) usable(name string) bool {
	size, ok := strings.CutSuffix(name, spareExt)
	if !ok {
		return false
	}
	size, _, ok = strings.Cut(size, "-")
	if n, err := strconv.ParseInt(size, 10, 64); !ok || err != nil || n != s.mib {
		return false
	}
	var st unix.Stat_t
	return unix.Lstat(filepath.Join(s.dir, name), &st) == nil &&
		st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == s.mib<<20
}

// Ready is how many images are ready now.
func (s *Spares) Ready() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ready)
}

// Run makes images until keep are ready, and again after each ask for one
// (placeImage), until ctx ends. One at a time: a burst of creates that outruns it formats its
// own (Prepare falls back to mkfs), so it never doubles their work.
func (s *Spares) Run(ctx context.Context) {
	for {
		for s.Ready() < s.keep && ctx.Err() == nil {
			if err := s.make(ctx); err != nil {
				if ctx.Err() == nil {
					s.log.Warn("workspace spare not made; creates format their own", "err", err)
				}
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
	}
}

// make formats one image under a scratch name and renames it into the
// ready set: a crash leaves only a .new file, removed by the next NewSpares.
func (s *Spares) make(ctx context.Context) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	final := filepath.Join(s.dir, fmt.Sprintf("%d-%s%s", s.mib, hex.EncodeToString(b[:]), spareExt))
	scratch := final + ".new"
	if err := formatImage(ctx, scratch, s.mib); err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, scratch, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		_ = os.Remove(scratch)
		return errs.Wrap(errs.Internal, err, "put spare image in place")
	}
	s.mu.Lock()
	s.ready = append(s.ready, final)
	s.mu.Unlock()
	return nil
}

// placeImage moves a ready image of mib MiB to image (which must not
// exist) and says whether it did; false leaves image absent, for mkfs.
func (s *Spares) placeImage(image string, mib int64) bool {
	if s == nil || mib != s.mib {
		return false
	}
	// Every ask wakes the refill, an empty one too: after a failed make
	// (a full disk), Run waits for this and tries again.
	defer func() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}()
	for {
		s.mu.Lock()
		if len(s.ready) == 0 {
			s.mu.Unlock()
			return false
		}
		p := s.ready[0]
		s.ready = s.ready[1:]
		s.mu.Unlock()
		if !s.usable(filepath.Base(p)) {
			_ = os.Remove(p)
			continue
		}
		err := unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, image, unix.RENAME_NOREPLACE)
		if err == nil {
			return true
		}
		// Another filesystem (EXDEV), or image appeared: the caller decides
		// without this spare, which is not given out again.
		_ = os.Remove(p)
		if errors.Is(err, unix.EEXIST) {
			return false
		}
		s.log.Warn("workspace spare not usable here; formatting instead", "image", image, "err", err)
		return false
	}
}

// formatImage creates path (which must not exist) as a sparse ext4 image
// of mib MiB; on error it is removed.
func formatImage(ctx context.Context, path string, mib int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "create disk image")
	}
	err = f.Truncate(mib << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		err = errs.Wrap(errs.Internal, err, "size disk image to %d MiB", mib)
	} else {
		err = run(ctx, "mkfs.ext4", mkfsArgs(path)...)
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}

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
	"slices"
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
//
// While Run runs, each ready image is also mounted ahead, as a detached
// mount (fsopen/fsmount: attached nowhere, in no mount namespace, so no
// mountinfo lists it and no container's mount namespace copies it) with the
// workspace's dirs made: a create moves it to its ws dir (move_mount,
// microseconds) instead of binding a loop device and mounting ext4, 4.5 of
// a cold create's ~57 ms on the reference host. The kernel drops such a
// mount when its last fd closes, so a daemon that exits or crashes leaves
// only unmounted images, taken again by the next NewSpares.
type Spares struct {
	dir  string
	mib  int64
	keep int
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex
	ready   []spare // formatted images, oldest first
	noMount bool    // a mount ahead failed once: this host mounts at create
}

// spare is a ready image and, when mounted ahead, the fd of its detached
// mount (-1 if none).
type spare struct {
	path string
	mnt  int
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
			s.ready = append(s.ready, spare{path: p, mnt: -1})
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
// (take), until ctx ends. One at a time: a burst of creates that outruns it formats its
// own (Prepare falls back to mkfs), so it never doubles their work. It
// mounts each ready image ahead, and unmounts those still ready when it returns.
func (s *Spares) Run(ctx context.Context) {
	defer s.release()
	s.mountReady()
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
	sp := spare{path: final, mnt: s.mountAhead(final)}
	s.mu.Lock()
	s.ready = append(s.ready, sp)
	s.mu.Unlock()
	return nil
}

// mountReady mounts ahead the ready images that are not (those NewSpares
// found), one at a time. Each is out of the ready set while it is mounted:
// a create must never take an image that is being mounted, or it would
// mount it a second time through another loop device.
func (s *Spares) mountReady() {
	for {
		s.mu.Lock()
		i := slices.IndexFunc(s.ready, func(sp spare) bool { return sp.mnt < 0 })
		if i < 0 || s.noMount {
			s.mu.Unlock()
			return
		}
		sp := s.ready[i]
		s.ready = slices.Delete(s.ready, i, i+1)
		s.mu.Unlock()
		sp.mnt = s.mountAhead(sp.path)
		s.mu.Lock()
		s.ready = append(s.ready, sp)
		s.mu.Unlock()
	}
}

// mountAhead mounts image detached, or answers -1 (and, after the first
// failure, stops trying: creates then mount their image as before).
func (s *Spares) mountAhead(image string) int {
	s.mu.Lock()
	off := s.noMount
	s.mu.Unlock()
	if off {
		return -1
	}
	fd, err := mountDetached(image)
	if err != nil {
		s.mu.Lock()
		s.noMount = true
		s.mu.Unlock()
		s.log.Info("workspace spares are not mounted ahead on this host; creates mount their own", "err", err)
		return -1
	}
	return fd
}

// release unmounts the ready images mounted ahead (they stay ready, as
// images) and waits until their loop devices are gone.
func (s *Spares) release() {
	s.mu.Lock()
	var images []string
	for i := range s.ready {
		if s.ready[i].mnt >= 0 {
			_ = unix.Close(s.ready[i].mnt)
			s.ready[i].mnt = -1
			images = append(images, s.ready[i].path)
		}
	}
	s.mu.Unlock()
	for _, image := range images {
		if err := waitDetached(context.Background(), image, detachTimeout); err != nil {
			s.log.Warn("workspace spare still attached after its unmount", "image", image, "err", err)
		}
	}
}

// take moves a ready image of mib MiB to image (which must not exist) and
// says whether it did, with the fd of its detached mount (-1: not mounted
// ahead), which the caller owns; false leaves image absent, for mkfs.
func (s *Spares) take(image string, mib int64) (bool, int) {
	if s == nil || mib != s.mib {
		return false, -1
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
			return false, -1
		}
		sp := s.ready[0]
		s.ready = s.ready[1:]
		s.mu.Unlock()
		drop := func() {
			if sp.mnt >= 0 {
				_ = unix.Close(sp.mnt)
			}
			_ = os.Remove(sp.path)
		}
		if !s.usable(filepath.Base(sp.path)) {
			drop()
			continue
		}
		err := unix.Renameat2(unix.AT_FDCWD, sp.path, unix.AT_FDCWD, image, unix.RENAME_NOREPLACE)
		if err == nil {
			return true, sp.mnt
		}
		// Another filesystem (EXDEV), or image appeared: the caller decides
		// without this spare, which is not given out again.
		drop()
		if errors.Is(err, unix.EEXIST) {
			return false, -1
		}
		s.log.Warn("workspace spare not usable here; formatting instead", "image", image, "err", err)
		return false, -1
	}
}

// mountDetached binds image to a loop device and mounts its ext4 as the
// workspace mount would be (nosuid, nodev, noatime, wsMountData), but
// detached, with the workspace's dirs made as mkdirsIn makes them; it
// returns the mount's fd. Closing it unmounts, and autoclear then detaches
// the device.
func mountDetached(image string) (int, error) {
	dev, err := attachLoop(image, false)
	if err != nil {
		return -1, err
	}
	defer dev.Close()
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "fsopen ext4")
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", dev.Name()); err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "fsconfig source %s", dev.Name())
	}
	if err := unix.FsconfigSetFlag(fsfd, wsMountData); err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "fsconfig %s", wsMountData)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "mount %s (%s)", dev.Name(), image)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOATIME)
	if err != nil {
		return -1, errs.Wrap(errs.Unavailable, err, "fsmount %s", image)
	}
	if err := makeWSDirs(mnt); err != nil {
		_ = unix.Close(mnt)
		return -1, err
	}
	return mnt, nil
}

// makeWSDirs makes in the workspace root mnt (a mount's fd) the dirs
// mkdirsIn makes below ws (which, after the move, finds them and sets the
// modes it sets).
func makeWSDirs(mnt int) error {
	for _, d := range []struct {
		name string
		mode uint32
	}{{"upper", 0o755}, {"work", 0o700}} {
		if err := unix.Mkdirat(mnt, d.name, d.mode); err != nil && !errors.Is(err, unix.EEXIST) { // mounted ahead before
			return errs.Wrap(errs.Internal, err, "create %s in workspace", d.name)
		}
	}
	return nil
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

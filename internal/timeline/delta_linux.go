package timeline

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/safefs"
)

// DeltaStat is what WriteDelta wrote.
type DeltaStat struct {
	Files, Dirs, Symlinks, Whiteouts int
	Bytes                            int64 // bytes of regular files
	// Refused are the changed paths left out: device nodes and sockets
	// (nothing a sandbox makes becomes a live device in a layer).
	Refused []string
	// Where a checkpoint's time went (set by the caller): the freeze, the
	// diff, the delta's writes, the layer store's import (a count of the
	// entries and the rename into place; no content is read) and the thaw.
	FreezeMillis, DiffMillis, WriteMillis, ImportMillis, ThawMillis int64
}

const opaqueXattr = "trusted.overlay.opaque"

// WriteDelta writes the changes res (a diff from a checkpoint's view to the
// view to) into dst, an empty host directory, as an overlay layer that
// turns the checkpoint's view into to when stacked above it: an added or
// modified object is the object itself (owner and mode of to, a file's
// bytes copied with copy_file_range and its times kept), a deleted one a
// whiteout (character device 0/0), a directory that replaced another
// object an opaque directory. Unchanged parents of changed paths are plain
// directories with to's owner and mode, so the layers below show through.
//
// to is hostile (a sandbox's upper): every object is read through
// fsdiff's safefs-backed layers (no symlink followed: a symlink is written
// as a symlink, its target never resolved; device nodes are refused and
// left out; a file is copied from the descriptor safefs opened, at most
// the size the diff saw). dst is written beneath a safefs root too, and
// nothing is written below an object the delta made a non-directory.
func WriteDelta(ctx context.Context, res *fsdiff.Result, to *fsdiff.Tree, dst string) (DeltaStat, error) {
	return WriteDeltaStamped(ctx, res, to, dst, time.Time{})
}

// stampMargin is how far before the capture began a file's ctime must lie
// for its stamp to be recorded: more than the coarse clock tick (a jiffy,
// at most 10 ms) file times are taken from, so that a write after the
// capture can never leave the same ctime behind.
const stampMargin = 100 * time.Millisecond

// WriteDeltaStamped is WriteDelta that also records, on each regular file
// it copies, the original's fsdiff.StatStamp (xattr fsdiff.StampXattr), so
// that the next checkpoint's diff (fsdiff.Options.QuickCheck) knows the
// file unchanged without reading it. A stamp is recorded only when it
// describes exactly the bytes copied: the original's stamp was the same
// before and after the copy, its size the size the diff saw, and its
// ctime before began − stampMargin (began: when the sandbox was frozen).
// A zero began records none.
func WriteDeltaStamped(ctx context.Context, res *fsdiff.Result, to *fsdiff.Tree, dst string, began time.Time) (DeltaStat, error) {
	root, err := safefs.OpenRoot(dst)
	if err != nil {
		return DeltaStat{}, err
	}
	defer root.Close()
	w := &deltaWriter{ctx: ctx, to: to, root: root, made: map[string]bool{".": true}}
	if !began.IsZero() {
		w.stampBefore = began.Add(-stampMargin)
	}
	changes := slices2(res.Changes)
	sort.Slice(changes, func(i, j int) bool { return changes[i].Path < changes[j].Path })
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return w.st, err
		}
		if err := w.write(c); err != nil {
			return w.st, errs.Wrap(errs.Internal, err, "write delta layer: %s", c.Path)
		}
	}
	// Directory owners and modes last, deepest first: a read-only
	// directory would stop the writes below it.
	for i := len(w.dirs) - 1; i >= 0; i-- {
		if err := w.dirMeta(w.dirs[i]); err != nil {
			return w.st, errs.Wrap(errs.Internal, err, "write delta layer: %s", w.dirs[i].rel)
		}
	}
	return w.st, nil
}

func slices2(in []fsdiff.Change) []fsdiff.Change { return append([]fsdiff.Change(nil), in...) }

type deltaDir struct {
	rel  string
	node fsdiff.Node
}

type deltaWriter struct {
	ctx     context.Context
	to      *fsdiff.Tree
	root    *safefs.Root
	made    map[string]bool // directories created in dst
	blocked []string        // non-directories and whiteouts written: nothing goes below them
	dirs    []deltaDir
	st      DeltaStat
	// stampBefore: record the stamp of originals whose ctime is before
	// it (zero: none).
	stampBefore time.Time
	buf         []byte // copyBytes' buffer, grown to copyBuf at most
}

// copyBuf is the buffer of a copy between filesystems: large reads and
// writes take half the time of io.Copy's 32 KiB ones (100 MiB from a
// sandbox's loop-mounted workspace into the layer store: ~90 → ~40 ms on
// a loaded 2-core host).
const copyBuf = 1 << 20

// fallocateMin is the size from which a copied file's blocks are
// allocated in one fallocate(2) before the copy: ext4's delayed
// allocation otherwise reserves and accounts block by block as the pages
// are written (100 MiB from a sandbox's workspace into the layer store:
// 29–34 → 19–25 ms on this 2-core host). A copy that comes short is an
// error either way, so the allocated size is never left as the file's.
const fallocateMin = 1 << 20

// copyBytes copies at most max bytes from in's offset to out's:
// copy_file_range where in and out are on one filesystem (the kernel
// copies, or shares the extents), else — a sandbox's upper is in its own
// loop-mounted image, so across filesystems it always is — sendfile, and
// where neither works read and write through one buffer of up to copyBuf
// bytes.
func (w *deltaWriter) copyBytes(out, in *os.File, max int64) (int64, error) {
	var done int64
	for done < max {
		k, err := unix.CopyFileRange(int(in.Fd()), nil, int(out.Fd()), nil, int(min(max-done, 1<<30)), 0)
		if err == nil && k > 0 {
			done += int64(k)
			continue
		}
		if err == nil { // end of the file
			return done, nil
		}
		if done == 0 && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)) {
			break
		}
		return done, err
	}
	if done >= max {
		return done, nil
	}
	// sendfile(2): the kernel copies page cache to page cache, one copy
	// and no buffer of ours.
	for done < max {
		k, err := unix.Sendfile(int(out.Fd()), int(in.Fd()), nil, int(min(max-done, 1<<30)))
		if err == nil && k > 0 {
			done += int64(k)
			continue
		}
		if err == nil {
			return done, nil
		}
		if done == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)) {
			break
		}
		return done, err
	}
	if done >= max {
		return done, nil
	}
	if size := int(min(max, copyBuf)); len(w.buf) < size {
		w.buf = make([]byte, size)
	}
	// Writer only: keep *os.File's ReadFrom (copy_file_range again) out.
	k, err := io.CopyBuffer(struct{ io.Writer }{out}, io.LimitReader(in, max-done), w.buf[:min(int64(len(w.buf)), max)])
	return done + k, err
}

func (w *deltaWriter) isBlocked(rel string) bool {
	for _, b := range w.blocked {
		if strings.HasPrefix(rel, b+"/") {
			return true
		}
	}
	return false
}

// parent makes the directories above rel that are not in dst yet, each as
// to has it; false if one of them is no directory in to (nothing to write).
func (w *deltaWriter) parent(rel string) (*os.File, bool, error) {
	dir := path.Dir(rel)
	var missing []string
	for d := dir; !w.made[d]; d = path.Dir(d) {
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		n, ok, err := w.to.Lookup(d)
		if err != nil {
			return nil, false, err
		}
		if !ok || n.Type != fsdiff.TypeDir {
			return nil, false, nil
		}
		if err := w.mkdir(d, n, false); err != nil {
			return nil, false, err
		}
	}
	f, err := w.root.OpenDir(dir)
	return f, err == nil, err
}

func (w *deltaWriter) mkdir(rel string, n fsdiff.Node, opaque bool) error {
	pf, err := w.root.OpenDir(path.Dir(rel))
	if err != nil {
		return err
	}
	defer pf.Close()
	if err := unix.Mkdirat(int(pf.Fd()), path.Base(rel), 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	w.made[rel] = true
	w.dirs = append(w.dirs, deltaDir{rel, n})
	w.st.Dirs++
	if opaque {
		df, err := w.root.OpenDir(rel)
		if err != nil {
			return err
		}
		defer df.Close()
		return unix.Fsetxattr(int(df.Fd()), opaqueXattr, []byte("y"), 0)
	}
	return nil
}

func (w *deltaWriter) dirMeta(d deltaDir) error {
	f, err := w.root.OpenDir(d.rel)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fchown(int(f.Fd()), int(d.node.UID), int(d.node.GID)); err != nil {
		return err
	}
	return unix.Fchmod(int(f.Fd()), d.node.Mode&0o7777)
}

func (w *deltaWriter) write(c fsdiff.Change) error {
	if c.Path == "." || w.isBlocked(c.Path) {
		return nil
	}
	pf, ok, err := w.parent(c.Path)
	if err != nil || !ok {
		return err
	}
	defer pf.Close()
	pfd, name := int(pf.Fd()), path.Base(c.Path)
	if c.Kind == fsdiff.Deleted || c.New == nil {
		w.blocked = append(w.blocked, c.Path)
		w.st.Whiteouts++
		return unix.Mknodat(pfd, name, unix.S_IFCHR, 0)
	}
	n := *c.New
	switch n.Type {
	case fsdiff.TypeDir:
		if w.made[c.Path] {
			return nil
		}
		return w.mkdir(c.Path, n, c.Old != nil && c.Old.Type != fsdiff.TypeDir)
	case fsdiff.TypeFile:
		w.blocked = append(w.blocked, c.Path)
		return w.copyFile(c.Path, pfd, name, n)
	case fsdiff.TypeSymlink:
		w.blocked = append(w.blocked, c.Path)
		if err := unix.Symlinkat(n.Target, pfd, name); err != nil {
			return err
		}
		w.st.Symlinks++
		return unix.Fchownat(pfd, name, int(n.UID), int(n.GID), unix.AT_SYMLINK_NOFOLLOW)
	case fsdiff.TypeFIFO:
		w.blocked = append(w.blocked, c.Path)
		if err := unix.Mknodat(pfd, name, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, name, int(n.UID), int(n.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.Fchmodat(pfd, name, n.Mode&0o7777, 0)
	default: // devices and sockets never travel into a layer
		w.st.Refused = append(w.st.Refused, c.Path)
		return nil
	}
}

// copyFile copies the regular file rel of to (opened beneath its layer by
// safefs) into a new file, at most the size the diff saw: a file that grew
// since is cut there, one that shrank is an error (the view moved).
func (w *deltaWriter) copyFile(rel string, pfd int, name string, n fsdiff.Node) error {
	in, _, err := w.to.Open(rel)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), name)
	defer out.Close()
	src, _ := in.(*os.File)
	var before unix.Stat_t
	stamp := !w.stampBefore.IsZero() && src != nil && unix.Fstat(int(src.Fd()), &before) == nil &&
		before.Size == n.Size && time.Unix(before.Ctim.Unix()).Before(w.stampBefore)
	if n.Size >= fallocateMin {
		// Best effort (a filesystem without it copies as before).
		_ = unix.Fallocate(fd, 0, 0, n.Size)
	}
	var copied int64
	if src != nil {
		copied, err = w.copyBytes(out, src, n.Size)
	} else {
		copied, err = io.Copy(out, io.LimitReader(in, n.Size))
	}
	if err != nil {
		return err
	}
	if copied != n.Size {
		return errs.E(errs.Conflict, "%s changed size while it was copied (%d of %d bytes)", rel, copied, n.Size)
	}
	if err := unix.Fchown(fd, int(n.UID), int(n.GID)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, n.Mode&0o7777); err != nil { // after chown: chown clears setuid
		return err
	}
	if src != nil {
		var st unix.Stat_t
		if err := unix.Fstat(int(src.Fd()), &st); err == nil {
			_ = unix.UtimesNanoAt(pfd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
			if stamp && fsdiff.StatStamp(&st) == fsdiff.StatStamp(&before) {
				// Best effort: a copy without a stamp is only copied again.
				_ = unix.Fsetxattr(fd, fsdiff.StampXattr, []byte(fsdiff.StatStamp(&st)), 0)
			}
		}
	}
	w.st.Files++
	w.st.Bytes += n.Size
	return nil
}

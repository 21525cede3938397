package fsdiff

import (
	"errors"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/safefs"
)

const opaqueXattr = "trusted.overlay.opaque"

// DirLayer is a layer stored as a directory: an overlay upper dir, a
// template layer, a snapshot's captured upper. Everything beneath its root
// is opened with safefs: no symlink is followed, no device node opened.
type DirLayer struct {
	root *safefs.Root
	id   string
	// unshift maps owner ids as stored to the ids seen inside the sandbox
	// (the upper of a sandbox in a user namespace holds shifted ids).
	unshift func(uint32) uint32
}

// OpenDirLayer opens dir as a layer named id ("" = dir itself). unshift,
// if not nil, maps stored owner ids to in-sandbox ids (rootfs.IDMap.Unshift).
func OpenDirLayer(dir, id string, unshift func(uint32) uint32) (*DirLayer, error) {
	r, err := safefs.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = dir
	}
	return &DirLayer{root: r, id: id, unshift: unshift}, nil
}

// Close releases the layer's root.
func (l *DirLayer) Close() error { return l.root.Close() }

// ID implements Layer.
func (l *DirLayer) ID() string { return l.id }

// Lstat implements Layer.
func (l *DirLayer) Lstat(rel string) (Entry, bool, error) {
	st, err := l.root.Lstat(rel)
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return Entry{}, false, nil
		}
		return Entry{}, false, err
	}
	uid, gid := st.Uid, st.Gid
	if l.unshift != nil {
		uid, gid = l.unshift(uid), l.unshift(gid)
	}
	e := Entry{Node: Node{Mode: st.Mode & 0o7777, UID: uid, GID: gid}}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type, e.Size = TypeFile, st.Size
	case unix.S_IFDIR:
		e.Type = TypeDir
		e.Opaque, err = l.opaque(rel)
		if err != nil {
			return Entry{}, false, err
		}
	case unix.S_IFLNK:
		e.Type = TypeSymlink
		e.Target, err = l.readlink(rel)
		if err != nil {
			return Entry{}, false, err
		}
		e.Size = int64(len(e.Target))
	case unix.S_IFIFO:
		e.Type = TypeFIFO
	case unix.S_IFSOCK:
		e.Type = TypeSocket
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return Entry{Whiteout: true}, true, nil
		}
		e.Type = TypeDevice
	default:
		e.Type = TypeDevice
	}
	return e, true, nil
}

// opaque reads the opaque mark of the directory rel (opened beneath the
// root, the xattr read from that very descriptor).
func (l *DirLayer) opaque(rel string) (bool, error) {
	d, err := l.root.OpenDir(rel)
	if err != nil {
		return false, err
	}
	defer d.Close()
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), opaqueXattr, buf)
	switch {
	case err == nil:
		return n == 1 && buf[0] == 'y', nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EPERM), errors.Is(err, unix.ERANGE):
		return false, nil
	}
	return false, errs.Wrap(errs.Internal, err, "read opaque mark of %q", rel)
}

// readlink reads the symlink rel's target (bounded by PATH_MAX) from its
// parent directory opened beneath the root; the link is never followed.
func (l *DirLayer) readlink(rel string) (string, error) {
	d, err := l.root.OpenDir(path.Dir(rel))
	if err != nil {
		return "", err
	}
	defer d.Close()
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(d.Fd()), path.Base(rel), buf)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "readlink %q", rel)
	}
	return string(buf[:n]), nil
}

// ReadDir implements Layer.
func (l *DirLayer) ReadDir(rel string) ([]string, error) {
	d, err := l.root.OpenDir(rel)
	if err != nil {
		if errs.Is(err, errs.NotFound) || errors.Is(err, safefs.ErrRefused) {
			return nil, nil // not a directory here: nothing of this layer below it
		}
		return nil, err
	}
	defer d.Close()
	var names []string
	for {
		batch, err := d.Readdirnames(1024)
		names = append(names, batch...)
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "read dir %q", rel)
		}
	}
	if rel == "." || rel == "" {
		kept := names[:0]
		for _, n := range names {
			if !skipEntry(n) {
				kept = append(kept, n)
			}
		}
		names = kept
	}
	sort.Strings(names)
	return names, nil
}

// Open implements Layer.
func (l *DirLayer) Open(rel string) (io.ReadCloser, error) { return l.root.Open(rel) }

// join appends name to the relative directory dir.
func join(dir, name string) string {
	if dir == "." || dir == "" {
		return name
	}
	return dir + "/" + name
}

// parentOf is path.Dir for relative paths, "." for a top-level name.
func parentOf(rel string) string {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "."
	}
	return rel[:i]
}

// StampXattr is where berth records, on a file it copied into a layer it
// wrote (a checkpoint's delta), the StatStamp of the original as it was
// copied. A trusted.* name: only host root sets or reads it, a sandbox
// never (its upper's xattrs are not carried into a delta), and overlayfs
// ignores all but trusted.overlay.*.
const StampXattr = "trusted.berth.stamp"

// StatStamp is a regular file's quick-check stamp: device, inode, size,
// mtime and ctime (nanoseconds). Any write, truncate, chmod, chown or
// utimes moves ctime, which no process can set; so an equal stamp means
// the same inode untouched since — as long as the stamp was taken when
// no write could still land in the same clock tick (the caller records
// only stamps of files whose ctime lies safely before the sandbox was
// frozen).
func StatStamp(st *unix.Stat_t) string {
	return strconv.FormatUint(st.Dev, 10) + ":" + strconv.FormatUint(st.Ino, 10) + ":" + strconv.FormatInt(st.Size, 10) + ":" +
		strconv.FormatInt(st.Mtim.Sec, 10) + "." + strconv.FormatInt(st.Mtim.Nsec, 10) + ":" +
		strconv.FormatInt(st.Ctim.Sec, 10) + "." + strconv.FormatInt(st.Ctim.Nsec, 10)
}

// maxStamp bounds a recorded stamp (seven decimal numbers and separators).
const maxStamp = 128

// liveStamp implements stamper: the stamp of the regular file rel now.
func (l *DirLayer) liveStamp(rel string) (string, error) {
	st, err := l.root.Lstat(rel)
	if err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", nil
	}
	return StatStamp(&st), nil
}

// recordedStamp implements stamper: the StampXattr of the regular file
// rel, read from the descriptor safefs opened (never a symlink's target,
// never a device), "" when it has none.
func (l *DirLayer) recordedStamp(rel string) (string, error) {
	f, err := l.root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, maxStamp)
	n, err := unix.Fgetxattr(int(f.Fd()), StampXattr, buf)
	switch {
	case err == nil:
		return string(buf[:n]), nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EPERM), errors.Is(err, unix.ERANGE):
		return "", nil
	}
	return "", errs.Wrap(errs.Internal, err, "read stamp of %q", rel)
}

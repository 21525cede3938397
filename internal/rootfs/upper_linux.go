package rootfs

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/safefs"
)

// An overlay upper dir records deletions as whiteouts (character devices
// 0/0) and replaced directories as opaque dirs (xattr trusted.overlay.opaque
// = "y"). overlayfs honours both in lower layers too, so an upper copied with
// them intact works as a read-only layer above the layers it was written over.

const opaqueXattr = "trusted.overlay.opaque"

// keepXattr says which extended attributes travel with a captured upper:
// every one except overlayfs' own bookkeeping (origin, impure, redirect ...),
// which describes the upper's old mount and would confuse a new one.
func keepXattr(name string) bool {
	if strings.HasPrefix(name, "trusted.overlay.") {
		return name == opaqueXattr
	}
	return true
}

// skipUpperEntry leaves out of a capture what belongs to one container run,
// not to the workspace: gVisor's own filestore for its in-sandbox overlay.
func skipUpperEntry(rel string) bool {
	return !strings.Contains(rel, "/") && strings.HasPrefix(rel, ".gvisor.filestore.")
}

// CopyUpper copies an overlay upper dir to dst (which must not exist or be
// empty) with owners, modes, times, xattrs, symlinks, FIFOs and whiteouts
// intact. Device nodes other than whiteouts are left out: a layer is host
// content, and nothing a sandbox made may be a live device there. The upper
// is the sandbox's: files are opened beneath it with no symlinks (safefs). Files are copied, never hard-linked to src (src lives on
// a sandbox's disk image, which goes away with the sandbox); hard links
// inside src stay hard links inside dst.
func CopyUpper(ctx context.Context, src, dst string) error {
	return CopyUpperUnshifted(ctx, src, dst, nil)
}

// CopyUpperUnshifted is CopyUpper for the upper of a sandbox that ran in
// user namespace m: the copy is owned by the ids seen inside (a layer any
// sandbox can mount, idmapped or not), file capabilities included.
func CopyUpperUnshifted(ctx context.Context, src, dst string, m *IDMap) error {
	type dirTime struct {
		path string
		st   *unix.Stat_t
	}
	var dirs []dirTime
	links := map[uint64]string{} // inode → first copy
	root, err := safefs.OpenRoot(src)
	if err != nil {
		return err
	}
	defer root.Close()
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if skipUpperEntry(rel) {
			return nil
		}
		out := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		st.Uid, st.Gid = m.Unshift(st.Uid), m.Unshift(st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(out, 0o700); err != nil && !(rel == "." && errors.Is(err, fs.ErrExist)) {
				return err
			}
			dirs = append(dirs, dirTime{out, &st})
		case unix.S_IFREG:
			if st.Nlink > 1 {
				if first, ok := links[st.Ino]; ok {
					return os.Link(first, out)
				}
				links[st.Ino] = out
			}
			if err := copyRegular(root, rel, out); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, out); err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
			if !keepSpecial(st.Mode, st.Rdev) {
				return nil
			}
			if err := unix.Mknod(out, st.Mode, int(st.Rdev)); err != nil {
				return err
			}
		default: // sockets: a capture has no use for them
			return nil
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return applyMeta(p, out, &st, m)
		}
		return nil
	})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "copy upper %s", src)
	}
	// Directory metadata last, deepest first: creating entries changes mtimes,
	// and a read-only mode would stop the copy.
	for i := len(dirs) - 1; i >= 0; i-- {
		srcPath := filepath.Join(src, strings.TrimPrefix(dirs[i].path, dst))
		if err := applyMeta(srcPath, dirs[i].path, dirs[i].st, m); err != nil {
			return errs.Wrap(errs.Internal, err, "copy upper %s", src)
		}
	}
	return nil
}

// keepSpecial says which special files travel into a layer: FIFOs and
// overlay whiteouts (character device 0/0), never a real device node.
func keepSpecial(mode uint32, rdev uint64) bool {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return true
	case unix.S_IFCHR:
		return rdev == 0
	}
	return false
}

func copyRegular(root *safefs.Root, rel, dst string) error {
	in, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// applyMeta gives dst src's owner, xattrs, mode and times (in that order:
// chown clears setuid bits and file capabilities). st's ids are already
// unshifted.
func applyMeta(src, dst string, st *unix.Stat_t, m *IDMap) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := copyXattrs(src, dst, m); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func copyXattrs(src, dst string, m *IDMap) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if !keepXattr(n) {
			continue
		}
		val, err := getXattr(src, n)
		if err != nil {
			return err
		}
		if n == capXattr {
			val = unshiftFileCaps(val, m)
		}
		if err := unix.Lsetxattr(dst, n, val, 0); err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP) {
				continue // e.g. user.* on a symlink
			}
			return &os.PathError{Op: "setxattr " + n, Path: dst, Err: err}
		}
	}
	return nil
}

const capXattr = "security.capability"

// unshiftFileCaps turns the file capabilities root set inside user namespace
// m (VFS_CAP_REVISION_3, which names the namespace's root as a host uid) into
// plain revision 2 ones, which apply to root of whichever namespace mounts
// the layer. Anything else is kept as it is.
func unshiftFileCaps(v []byte, m *IDMap) []byte {
	const rev3, rev2, v3Len = 0x03000000, 0x02000000, 24
	if m == nil || len(v) != v3Len || binary.LittleEndian.Uint32(v)&0xff000000 != rev3 {
		return v
	}
	if m.Unshift(binary.LittleEndian.Uint32(v[20:])) != 0 {
		return v
	}
	out := slices.Clone(v[:20])
	binary.LittleEndian.PutUint32(out, binary.LittleEndian.Uint32(v)&^0xff000000|rev2)
	return out
}

func listXattrs(p string) ([]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

func getXattr(p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}

// ExtractUpperTar unpacks a tar of an overlay upper (as `runsc tar
// rootfs-upper` writes it: whiteouts as char 0/0 entries, opaque dirs as
// SCHILY.xattr.trusted.overlay.opaque records) into dst. Entries may not
// leave dst, through ".." or through a symlink.
func ExtractUpperTar(ctx context.Context, r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	type dirMeta struct {
		path string
		hdr  *tar.Header
	}
	var dirs []dirMeta
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "archive: read")
		}
		rel, err := confined(dst, hdr.Name)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		if rel != "." && skipUpperEntry(rel) {
			continue
		}
		mode := uint32(hdr.Mode) & 0o7777
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(out, 0o700); err != nil {
				if !errors.Is(err, fs.ErrExist) {
					return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
				}
				// Its metadata is applied by path at the end: it must be
				// a directory, never a symlink an earlier entry made.
				if fi, err := os.Lstat(out); err != nil || !fi.IsDir() {
					return errs.Field("archive", "entry %q is a directory over a non-directory", hdr.Name)
				}
			}
			dirs = append(dirs, dirMeta{out, hdr})
			continue
		case tar.TypeReg:
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, out); err != nil {
				return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
			}
		case tar.TypeLink:
			target, err := confined(dst, hdr.Linkname)
			if err != nil {
				return err
			}
			if err := os.Link(filepath.Join(dst, target), out); err != nil {
				return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
			}
			continue
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
			rdev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
			if !keepSpecial(kind, rdev) {
				continue // a device node the sandbox made; whiteouts are 0/0
			}
			if err := unix.Mknod(out, kind|mode, int(rdev)); err != nil {
				return errs.Wrap(errs.Internal, err, "archive: %s", hdr.Name)
			}
		default:
			continue
		}
		if err := applyTarMeta(out, hdr); err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := applyTarMeta(dirs[i].path, dirs[i].hdr); err != nil {
			return err
		}
	}
	return nil
}

// confined cleans a tar entry name and checks that it stays inside root,
// also through symlinks already extracted.
func confined(root, name string) (string, error) {
	rel := filepath.Clean("/" + name)[1:]
	if rel == "" {
		return ".", nil
	}
	if strings.Contains(name, "..") {
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return "", errs.Field("archive", "entry %q leaves the root", name)
			}
		}
	}
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		fi, err := os.Lstat(filepath.Join(root, filepath.Join(parts[:i]...)))
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return "", errs.Field("archive", "entry %q goes through a symlink", name)
		}
	}
	return rel, nil
}

func applyTarMeta(p string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		if n, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && keepXattr(n) {
			if err := unix.Lsetxattr(p, n, []byte(v), 0); err != nil && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOTSUP) {
				return errs.Wrap(errs.Internal, err, "archive: xattr %s on %s", n, hdr.Name)
			}
		}
	}
	if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return errs.Wrap(errs.Internal, err, "archive: chown %s", hdr.Name)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Chmod(p, uint32(hdr.Mode)&0o7777); err != nil {
			return errs.Wrap(errs.Internal, err, "archive: chmod %s", hdr.Name)
		}
	}
	mt := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	at := mt
	if !hdr.AccessTime.IsZero() {
		at = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{at, mt}, unix.AT_SYMLINK_NOFOLLOW)
}

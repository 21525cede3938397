package template

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// ExtractBuildContext unpacks a build context tar (plain or gzip) into dir
// with the same confinement as ImportTar.
func ExtractBuildContext(ctx context.Context, r io.Reader, dir string) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errs.Field("context", "bad gzip stream: %v", err)
		}
		defer zr.Close()
		src = zr
	}
	_, err := extractTar(ctx, src, dir, func(int64) {}, slog.New(slog.DiscardHandler))
	return err
}

// CopySpec is one COPY/ADD: sources relative to the build context (globs
// allowed), a destination inside the rootfs (absolute), and the owner and
// optional mode of what is written.
type CopySpec struct {
	Sources  []string
	Dest     string
	UID, GID int
	Mode     os.FileMode // 0 = keep the source's
}

// ResolveSources expands the sources inside the context dir, refusing any
// that leave it; the result is sorted context-relative paths.
func (c CopySpec) ResolveSources(ctxDir string) ([]string, error) {
	var out []string
	for _, s := range c.Sources {
		clean := path.Clean("/" + s)[1:]
		if clean == "" {
			clean = "."
		}
		if !filepath.IsLocal(clean) && clean != "." {
			return nil, errs.Field("source", "%q leaves the build context", s)
		}
		matches, err := filepath.Glob(filepath.Join(ctxDir, clean))
		if err != nil {
			return nil, errs.Field("source", "bad pattern %q: %v", s, err)
		}
		if len(matches) == 0 {
			return nil, errs.Field("source", "%q: no such file in the build context", s)
		}
		for _, m := range matches {
			rel, _ := filepath.Rel(ctxDir, m)
			if rp, err := filepath.EvalSymlinks(m); err != nil || !strings.HasPrefix(rp+"/", filepath.Clean(ctxDir)+"/") {
				return nil, errs.Field("source", "%q resolves outside the build context", s)
			}
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out, nil
}

// ContentHash hashes the resolved sources' content (names, modes and bytes;
// not times), so a COPY step's cache key changes exactly when what it reads does.
func (c CopySpec) ContentHash(ctx context.Context, ctxDir string, srcs []string) (string, error) {
	var parts []string
	for _, s := range srcs {
		d, _, _, err := TreeDigest(ctx, filepath.Join(ctxDir, s))
		if err != nil {
			return "", err
		}
		parts = append(parts, s+"="+d)
	}
	return strings.Join(parts, ","), nil
}

// Fill writes the COPY result into an empty layer dir, Docker's way: a
// directory source copies its contents; several sources or a dest ending in
// "/" (or destIsDir) make dest a directory. Parents are created 0755 root.
// The context is the tenant's, symlinks included: every write goes through
// an os.Root of dir, so a symlink one source plants (dest/foo -> /etc) can
// never lead a later source's files out of the layer.
func (c CopySpec) Fill(ctxDir string, srcs []string, destIsDir bool, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open layer dir")
	}
	defer root.Close()
	dest := path.Clean(c.Dest)
	toDir := destIsDir || strings.HasSuffix(c.Dest, "/") || len(srcs) > 1
	for _, s := range srcs {
		src := filepath.Join(ctxDir, s)
		fi, err := os.Stat(src)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "COPY source %s", s)
		}
		target := dest
		if fi.IsDir() {
			target = dest
		} else if toDir {
			target = path.Join(dest, filepath.Base(s))
		}
		out := strings.TrimPrefix(path.Clean("/"+target), "/")
		if out == "" {
			out = "."
		}
		if err := mkdirParents(root, path.Dir(out)); err != nil {
			return err
		}
		if err := c.copyTree(root, src, out); err != nil {
			return errs.Reclassify(errs.InvalidArgument, err, "COPY %s to %s", s, target)
		}
	}
	return nil
}

// mkdirParents creates rel's directories in root, 0755. One that exists as
// anything but a directory (a symlink a source planted) is refused.
func mkdirParents(root *os.Root, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		cur = path.Join(cur, part)
		if err := root.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return errs.Wrap(errs.InvalidArgument, err, "create /%s", cur)
		}
		if fi, err := root.Lstat(cur); err != nil || !fi.IsDir() {
			return errs.Field("dest", "/%s exists in the layer and is not a directory", cur)
		}
		_ = root.Chmod(cur, 0o755)
	}
	return nil
}

func (c CopySpec) copyTree(root *os.Root, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := path.Join(dst, filepath.ToSlash(rel))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		mode := fi.Mode().Perm() | fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
		if c.Mode != 0 {
			mode = c.Mode
		}
		switch {
		case fi.IsDir():
			if err := root.Mkdir(out, 0o700); err != nil {
				if !errors.Is(err, fs.ErrExist) {
					return err
				}
				// A later source replaces what an earlier one left there
				// (a symlink, a file) by its directory.
				if ofi, err := root.Lstat(out); err != nil {
					return err
				} else if !ofi.IsDir() {
					if err := root.Remove(out); err != nil {
						return err
					}
					if err := root.Mkdir(out, 0o700); err != nil {
						return err
					}
				}
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			_ = root.Remove(out)
			if err := root.Symlink(t, out); err != nil {
				return err
			}
			return root.Lchown(out, c.UID, c.GID)
		case fi.Mode().IsRegular():
			if err := copyFile(root, p, out); err != nil {
				return err
			}
		default:
			return nil // devices, fifos and sockets are not copied
		}
		if err := root.Lchown(out, c.UID, c.GID); err != nil {
			return err
		}
		if err := root.Chmod(out, mode); err != nil {
			return err
		}
		return root.Chtimes(out, fi.ModTime(), fi.ModTime())
	})
}

// copyFile copies the regular file src (refusing anything else without
// opening it for long: O_NONBLOCK) to dst inside root.
func copyFile(root *os.Root, src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return errors.Join(err, errs.Field("source", "%s is not a regular file", src))
	}
	_ = root.Remove(dst)
	out, err := root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ParseChown reads COPY --chown=UID[:GID] (numeric only: names would need
// the image's /etc/passwd).
func ParseChown(s string) (int, int, error) {
	if s == "" {
		return 0, 0, nil
	}
	u, g, ok := strings.Cut(s, ":")
	uid, err := strconv.Atoi(u)
	if err != nil || uid < 0 {
		return 0, 0, errs.Field("chown", "%q: only numeric UID[:GID] is supported", s)
	}
	gid := uid
	if ok {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return 0, 0, errs.Field("chown", "%q: only numeric UID[:GID] is supported", s)
		}
	}
	return uid, gid, nil
}

// ParseChmod reads COPY --chmod=OCTAL.
func ParseChmod(s string) (os.FileMode, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, errs.Field("chmod", "%q is not an octal mode", s)
	}
	m := os.FileMode(v & 0o777)
	for bit, fm := range map[uint64]os.FileMode{0o4000: os.ModeSetuid, 0o2000: os.ModeSetgid, 0o1000: os.ModeSticky} {
		if v&bit != 0 {
			m |= fm
		}
	}
	return m, nil
}

// PathInLayers reports whether p (absolute) exists in the stack of layer
// directories (top first), honouring overlay whiteouts on the way down.
func PathInLayers(layerDirs []string, p string) (isDir, exists bool) {
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" {
		return true, true
	}
	for _, l := range layerDirs {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(l, rel), &st); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
				return false, false // whiteout
			}
			return st.Mode&unix.S_IFMT == unix.S_IFDIR, true
		}
	}
	return false, false
}

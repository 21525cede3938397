package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

type extractStats struct {
	entries int64
	skipped int64
}

// xattrs carried through tar (as PAX SCHILY.xattr.* records). Others
// (security.selinux, system.*) describe the building host, not the layer.
var keptXattrs = map[string]bool{"security.capability": true}

const paxXattr = "SCHILY.xattr."

// cleanEntryName turns a tar entry name into a path relative to the root,
// refusing names that leave it. "/etc/x" and "./etc/x" both become "etc/x";
// the root itself is ".".
func cleanEntryName(name string) (string, error) {
	n := path.Clean("/" + name) // Clean of an absolute path never keeps ".."
	if strings.Contains(name, "..") {
		// Be explicit rather than silently clamping "../x" to "x".
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return "", errs.Field("archive", "entry %q leaves the root", name)
			}
		}
	}
	n = strings.TrimPrefix(n, "/")
	if n == "" {
		return ".", nil
	}
	if !filepath.IsLocal(n) {
		return "", errs.Field("archive", "entry %q leaves the root", name)
	}
	return n, nil
}

// extractTar writes the tar stream into dir, confined by os.Root: every
// path is resolved inside dir, and resolving through an absolute symlink or a
// symlink leading outside fails.
func extractTar(ctx context.Context, r io.Reader, dir string, tick func(entries int64), log *slog.Logger) (extractStats, error) {
	var st extractStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, errs.Wrap(errs.Internal, err, "open import dir")
	}
	defer root.Close()
	chown := os.Geteuid() == 0

	type dirMeta struct {
		name  string
		mode  os.FileMode
		mtime time.Time
	}
	var dirs []dirMeta
	tr := tar.NewReader(r)
	for {
		if st.entries%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return st, errs.Wrap(errs.Unavailable, err, "import cancelled")
			}
			if st.entries > 0 {
				tick(st.entries)
			}
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, errs.Wrap(errs.InvalidArgument, err, "archive: read entry")
		}
		st.entries++
		name, err := cleanEntryName(hdr.Name)
		if err != nil {
			return st, err
		}
		fail := func(err error) error { return entryError(hdr.Name, err) }
		if name == "." && hdr.Typeflag != tar.TypeDir && hdr.Typeflag != tar.TypeXGlobalHeader {
			return st, errs.Field("archive", "entry %q: the root must be a directory", hdr.Name)
		}
		fi := hdr.FileInfo()
		mode := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		if name != "." {
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return st, fail(err)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := clearFor(root, name, true); err != nil {
					return st, fail(err)
				}
				if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
					return st, fail(err)
				}
			}
			if chown {
				if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
					return st, fail(err)
				}
			}
			// Modes and times are applied at the end: a read-only
			// directory must still take its children, and writing
			// children changes its mtime.
			dirs = append(dirs, dirMeta{name, mode, hdr.ModTime})
		case tar.TypeReg, tar.TypeRegA:
			if err := clearFor(root, name, false); err != nil {
				return st, fail(err)
			}
			if err := writeFile(root, name, tr, hdr, mode, chown); err != nil {
				return st, fail(err)
			}
		case tar.TypeSymlink:
			if err := clearFor(root, name, false); err != nil {
				return st, fail(err)
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return st, fail(err)
			}
			if chown {
				if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
					return st, fail(err)
				}
			}
		case tar.TypeLink:
			target, err := cleanEntryName(hdr.Linkname)
			if err != nil {
				return st, errs.Field("archive", "hard link %q targets %q outside the root", hdr.Name, hdr.Linkname)
			}
			if err := clearFor(root, name, false); err != nil {
				return st, fail(err)
			}
			if err := root.Link(target, name); err != nil {
				return st, fail(err)
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			st.skipped++
			log.Debug("skipping special file", "name", hdr.Name)
		case tar.TypeXGlobalHeader:
		default:
			st.skipped++
			log.Debug("skipping unsupported tar entry", "name", hdr.Name, "type", string(hdr.Typeflag))
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if fi, err := root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return st, errs.Wrap(errs.Internal, err, "chmod %q", d.name)
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return st, errs.Wrap(errs.Internal, err, "chtimes %q", d.name)
		}
	}
	return st, nil
}

// clearFor removes whatever is at name unless it is a directory and a
// directory is wanted (a later tar entry replaces an earlier one).
func clearFor(root *os.Root, name string, wantDir bool) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if wantDir {
			return nil
		}
		return root.RemoveAll(name)
	}
	return root.Remove(name)
}

func writeFile(root *os.Root, name string, r io.Reader, hdr *tar.Header, mode os.FileMode, chown bool) (err error) {
	// O_NOFOLLOW: clearFor removed any symlink, but refuse to write through
	// one should it reappear.
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	fd := int(f.Fd())
	if chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	// chmod after chown: chown clears setuid/setgid.
	if err := f.Chmod(mode); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, paxXattr); ok && keptXattrs[x] {
			if err := unix.Fsetxattr(fd, x, []byte(v), 0); err != nil {
				return fmt.Errorf("set xattr %s: %w", x, err)
			}
		}
	}
	tv := unix.NsecToTimeval(hdr.ModTime.UnixNano())
	return unix.Futimes(fd, []unix.Timeval{tv, tv})
}

// entryError classifies a failure to write one entry: a path that resolves
// outside the root is the archive's fault, a full disk is not.
func entryError(name string, err error) error {
	kind := errs.Internal
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		kind = errs.ResourceExhausted
	case errors.Is(err, os.ErrPermission):
		kind = errs.PermissionDenied
	case isEscape(err):
		return &errs.Error{Kind: errs.InvalidArgument, Field: "archive",
			Message: fmt.Sprintf("archive: entry %q resolves outside the root", name), Err: err}
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, fs.ErrExist):
		kind = errs.InvalidArgument
	}
	return &errs.Error{Kind: kind, Field: "archive", Message: fmt.Sprintf("archive: entry %q", name), Err: err}
}

// isEscape reports os.Root's refusal to leave the root; os exports no
// sentinel for it.
func isEscape(err error) bool {
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return err != nil && strings.Contains(err.Error(), "escapes from parent")
}

package template

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

type packOptions struct {
	// fixedTime, when set, replaces every mtime so the tar (and so the
	// layer digest) depends only on the files' contents.
	fixedTime *time.Time
	// canonical drops what extractTar does not restore (a symlink's
	// mtime), so a layer packs to the same blob on every host it was
	// extracted on.
	canonical bool
	tick      func(entries int64)
}

// packTar writes dir as a tar stream in lexical order with numeric
// ownership, hard links, device nodes and security.capability xattrs, so
// that extractTar recreates it. Sockets are skipped.
func packTar(ctx context.Context, w io.Writer, dir string, opt packOptions) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if n > 0 && opt.tick != nil {
				opt.tick(n)
			}
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if rel == "." {
			hdr.Name = "./"
		} else if fi.IsDir() {
			hdr.Name += "/"
		}
		// Names belong to the rootfs's /etc/passwd, not the building host's.
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.ModTime = hdr.ModTime.Truncate(time.Second)
		if opt.fixedTime != nil {
			hdr.ModTime = *opt.fixedTime
		}
		if opt.canonical && fi.Mode()&fs.ModeSymlink != 0 {
			hdr.ModTime = time.Unix(0, 0)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, seen := links[key]; seen {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[key] = hdr.Name
			}
		}
		if fi.Mode().IsRegular() || fi.IsDir() {
			for name := range keptXattrs {
				if v, err := lgetxattr(p, name); err == nil && len(v) > 0 {
					if hdr.PAXRecords == nil {
						hdr.PAXRecords = map[string]string{}
					}
					hdr.PAXRecords[paxXattr+name] = string(v)
					hdr.Format = tar.FormatPAX
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n++
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "pack %s", dir)
	}
	if err := tw.Close(); err != nil {
		return errs.Wrap(errs.Internal, err, "pack %s", dir)
	}
	return nil
}

func lgetxattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if err == unix.ERANGE {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

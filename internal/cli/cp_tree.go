package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/batchname"
	"github.com/berth-dev/berth/internal/errs"
)

// cpTreeUp copies the local directory src beneath the sandbox directory dst
// in one batch request (a tar streamed as it is read: one durability
// barrier for the whole tree instead of one per file). Symbolic links are
// not sent (the batch API takes files and directories only); the count is
// reported.
func cpTreeUp(ctx context.Context, sb *client.Sandbox, src, dst, user string, stderr io.Writer) error {
	pr, pw := io.Pipe()
	skipped := 0
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil || rel == "." {
				return err
			}
			rel = filepath.ToSlash(rel)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case fi.IsDir():
				return tw.WriteHeader(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()})
			case fi.Mode().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: int64(fi.Mode().Perm()), Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
					return err
				}
				_, err = io.CopyN(tw, f, fi.Size())
				return err
			default:
				skipped++
				return nil
			}
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	res, err := sb.WriteFiles(ctx, dst, user, pr)
	_ = pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d files, %d directories, %d bytes written beneath %s (%s)\n", res.Files, res.Dirs, res.Bytes, res.Dir, res.Durable)
	if skipped > 0 {
		fmt.Fprintf(stderr, "%d symbolic links or special files not copied\n", skipped)
	}
	return nil
}

// cpTreeDown extracts the sandbox directory src's tree into the local
// directory dst (created if missing). The tar is sandbox content, so hostile:
// every name is checked, extraction goes through an os.Root at dst (no
// entry can land outside it, through a link or otherwise), and symbolic
// links from the sandbox are never created on the host (counted instead).
func cpTreeDown(ctx context.Context, sb *client.Sandbox, src, dst, user string, stderr io.Writer) error {
	body, err := sb.ReadFiles(ctx, src, user)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "cp: destination")
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "cp: destination")
	}
	defer root.Close()
	tr := tar.NewReader(body)
	files, links := 0, 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errs.Wrap(errs.Unavailable, err, "cp: download cut after %d files", files)
		}
		if err := batchname.Check(h.Name); err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		perm := os.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, perm|0o700); err != nil {
				return errs.Wrap(errs.InvalidArgument, err, "cp: entry %q", name)
			}
		case tar.TypeReg:
			if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return errs.Wrap(errs.InvalidArgument, err, "cp: entry %q", name)
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
			if err != nil {
				return errs.Wrap(errs.InvalidArgument, err, "cp: entry %q", name)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return errs.Wrap(errs.Unavailable, err, "cp: entry %q", name)
			}
			files++
		default:
			links++
		}
	}
	fmt.Fprintf(stderr, "%d files written beneath %s\n", files, dst)
	if links > 0 {
		fmt.Fprintf(stderr, "%d symbolic links not created on the host\n", links)
	}
	return nil
}

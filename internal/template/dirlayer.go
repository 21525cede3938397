package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// ImportDir stores a directory tree as a layer: fill writes the tree into
// the (empty) directory it is given, and the layer's digest is TreeDigest of
// the result, so capturing the same content twice stores it once. Like
// ImportTar, the layer appears atomically under its digest. Used for
// snapshots, whose layers come from an overlay upper dir rather than a tar
// (and keep its whiteouts, which ImportTar would drop).
func (s *Store) ImportDir(ctx context.Context, fill func(dir string) error) (Layer, error) {
	start := time.Now()
	tmp, err := s.fillTemp(fill)
	if err != nil {
		return Layer{}, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	digest, entries, size, err := TreeDigest(ctx, tmp)
	if err != nil {
		return Layer{}, err
	}
	if s.HasLayer(digest) {
		return s.Layer(digest)
	}
	l := Layer{Digest: digest, TarSize: size, Entries: entries, CreatedAt: time.Now().UTC()}
	meta, _ := json.Marshal(l)
	if err := os.WriteFile(s.metaPath(digest), meta, 0o600); err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "write layer metadata")
	}
	if err := os.Rename(tmp, s.LayerPath(digest)); err != nil {
		if s.HasLayer(digest) {
			return s.Layer(digest)
		}
		return Layer{}, errs.Wrap(errs.Internal, err, "move layer into place")
	}
	ok = true
	l.Path = s.LayerPath(digest)
	s.log.Info("layer stored from directory", "digest", digest, "entries", entries, "bytes", size,
		"duration", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// TreeDigest hashes a directory tree by content: every entry's path, type,
// mode, owner, device number, symlink target, extended attributes and file
// bytes, in lexical order. Times are left out, so the same files captured
// twice hash the same. It returns the digest (64 hex), the entry count and
// the total size of regular files.
func TreeDigest(ctx context.Context, dir string) (string, int64, int64, error) {
	h := sha256.New()
	var entries, size int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		entries++
		fmt.Fprintf(h, "%q %o %d:%d %d", rel, st.Mode, st.Uid, st.Gid, st.Rdev)
		if err := hashXattrs(h, p); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", target)
		case unix.S_IFREG:
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			size += n
			fmt.Fprintf(h, " %d", n)
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", 0, 0, errs.Wrap(errs.Internal, err, "hash layer %s", dir)
	}
	return hex.EncodeToString(h.Sum(nil)), entries, size, nil
}

func hashXattrs(h hash.Hash, p string) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if err == unix.ENOTSUP {
			return nil
		}
		return err
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return err
	}
	names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
	sort.Strings(names)
	for _, n := range names {
		vn, err := unix.Lgetxattr(p, n, nil)
		if err != nil {
			return err
		}
		v := make([]byte, vn)
		if vn, err = unix.Lgetxattr(p, n, v); err != nil {
			return err
		}
		fmt.Fprintf(h, " %q=%q", n, v[:vn])
	}
	return nil
}

// ImportDirNamed stores a directory tree as a layer under name, a digest
// the caller derived, instead of TreeDigest of the content: fill writes
// the tree into the (empty) directory it is given, and nothing of it is
// read back but its entries' metadata (for the counts). For a tree that
// is unique by construction and whose name must not cost a read of its
// bytes: a checkpoint's delta (internal/timeline names it by a digest of
// its checkpoint id and its entry list). The name shares the sha256
// namespace with content digests; the caller must make it one no content
// digest can be (a domain-separated hash over a fresh id). A name already
// stored is AlreadyExists: such a layer is never deduplicated. Like
// ImportDir, the layer appears atomically under its name.
func (s *Store) ImportDirNamed(ctx context.Context, name string, fill func(dir string) error) (Layer, error) {
	if err := ValidateDigest(name); err != nil {
		return Layer{}, err
	}
	if s.HasLayer(name) {
		return Layer{}, errs.E(errs.AlreadyExists, "layer %s is already stored", name)
	}
	start := time.Now()
	tmp, err := s.fillTemp(fill)
	if err != nil {
		return Layer{}, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	var entries, size int64
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		entries++
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			size += fi.Size()
		}
		return nil
	})
	if err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "count layer %s", name)
	}
	l := Layer{Digest: name, TarSize: size, Entries: entries, CreatedAt: time.Now().UTC()}
	meta, _ := json.Marshal(l)
	if err := os.WriteFile(s.metaPath(name), meta, 0o600); err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "write layer metadata")
	}
	// rename(2) onto an existing directory that is not empty fails: a
	// concurrent import under the same name never replaces a layer.
	if err := os.Rename(tmp, s.LayerPath(name)); err != nil {
		if s.HasLayer(name) {
			return Layer{}, errs.E(errs.AlreadyExists, "layer %s is already stored", name)
		}
		_ = os.Remove(s.metaPath(name))
		return Layer{}, errs.Wrap(errs.Internal, err, "move layer into place")
	}
	ok = true
	l.Path = s.LayerPath(name)
	s.log.Info("layer stored from directory", "digest", name, "entries", entries, "bytes", size,
		"named", true, "duration", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// fillTemp makes a temp dir in the store (0755, on the layers' filesystem
// so a rename puts it in place) and has fill write the layer's tree into
// it; on error the dir is gone.
func (s *Store) fillTemp(fill func(dir string) error) (string, error) {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "create layer dir")
	}
	if err = os.Chmod(tmp, 0o755); err != nil {
		err = errs.Wrap(errs.Internal, err, "create layer dir")
	} else {
		err = fill(tmp)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	return tmp, nil
}

package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// OCI layer tars mark deletions with AUFS-style whiteout files; overlayfs,
// which stacks berth's layers, wants a 0/0 character device for a deleted
// entry and an xattr on a directory whose lower contents are hidden.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// ImportOCILayer extracts one uncompressed OCI image layer into a layer
// named by its diffID (the sha256 of the uncompressed tar, which is also
// what ImportTar would name it), converting OCI whiteouts to overlayfs ones
// before the layer appears: "dir/.wh.name" becomes a 0/0 character device
// "dir/name", and "dir/.wh..wh..opq" marks dir opaque
// (trusted.overlay.opaque=y). wantDiffID ("" = do not check) is the digest
// the image config promises; a stream that hashes differently fails with
// errs.InvalidArgument and stores nothing. A layer already stored is reused
// without reading r.
func (s *Store) ImportOCILayer(ctx context.Context, r io.Reader, wantDiffID string, progress func(Progress)) (Layer, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	if wantDiffID != "" {
		if err := ValidateDigest(wantDiffID); err != nil {
			return Layer{}, err
		}
		if s.HasLayer(wantDiffID) {
			return s.Layer(wantDiffID)
		}
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix)
	if err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "create import dir")
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "create import dir")
	}
	h := sha256.New()
	cr := &countingHashReader{r: bufio.NewReaderSize(r, 1<<20), h: h}
	st, err := extractTar(ctx, cr, tmp, func(entries int64) {
		progress(Progress{Phase: PhaseExtract, Message: fmt.Sprintf("extracted %d entries", entries), Bytes: cr.n})
	}, s.log)
	if err != nil {
		return Layer{}, err
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return Layer{}, errs.Wrap(errs.InvalidArgument, err, "archive: read")
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if wantDiffID != "" && digest != wantDiffID {
		return Layer{}, errs.Field("archive", "layer content hashes to sha256:%s, the image config says sha256:%s", digest, wantDiffID)
	}
	if s.HasLayer(digest) {
		return s.Layer(digest)
	}
	if err := ConvertWhiteouts(ctx, tmp); err != nil {
		return Layer{}, err
	}
	l := Layer{Digest: digest, TarSize: cr.n, Entries: st.entries, Skipped: st.skipped, CreatedAt: time.Now().UTC()}
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
	s.log.Info("oci layer imported", "digest", digest, "tar_bytes", l.TarSize, "entries", l.Entries,
		"duration", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// ConvertWhiteouts rewrites the OCI whiteout files extracted into dir as
// overlayfs whiteouts (see ImportOCILayer). Needs CAP_MKNOD and
// CAP_SYS_ADMIN (trusted.* xattrs), i.e. root.
func ConvertWhiteouts(ctx context.Context, dir string) error {
	type wh struct{ dir, name string }
	var found []wh
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), whiteoutPrefix) && !d.IsDir() {
			found = append(found, wh{filepath.Dir(p), d.Name()})
		}
		return nil
	})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "scan layer for whiteouts")
	}
	for _, w := range found {
		p := filepath.Join(w.dir, w.name)
		if err := os.Remove(p); err != nil {
			return errs.Wrap(errs.Internal, err, "remove whiteout %s", p)
		}
		if w.name == whiteoutOpaque {
			if err := unix.Lsetxattr(w.dir, opaqueXattr, []byte("y"), 0); err != nil {
				return errs.Wrap(errs.Internal, err, "mark %s opaque", w.dir)
			}
			continue
		}
		target := filepath.Join(w.dir, strings.TrimPrefix(w.name, whiteoutPrefix))
		if _, err := os.Lstat(target); err == nil {
			// The same layer both deletes and adds the name: the entry wins.
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return errs.Wrap(errs.Internal, err, "whiteout %s", target)
		}
		if err := unix.Mknod(target, unix.S_IFCHR|0o000, 0); err != nil {
			return errs.Wrap(errs.Internal, err, "create whiteout %s", target)
		}
	}
	return nil
}

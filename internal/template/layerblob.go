package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// A layer's blob is its canonical tar: packTar of the stored directory
// (lexical order, numeric owners, mtimes to the second, symlinks' at the
// epoch since extraction does not keep them). It is how layers
// travel between hosts. The store keeps directories, not the tars they
// were imported from, so a layer's digest (of its original tar, or its
// TreeDigest) cannot be checked on a copy; the blob's own sha256 is what
// a receiver verifies, against a value the layer's first publisher
// recorded (cluster mode: the Template object).

// WriteBlob writes layer digest's blob to w; NotFound if it is not stored.
func (s *Store) WriteBlob(ctx context.Context, w io.Writer, digest string) error {
	l, err := s.Layer(digest)
	if err != nil {
		return err
	}
	return packTar(ctx, w, l.Path, packOptions{canonical: true})
}

// BlobDigest is the sha256 (hex) and size of layer digest's blob.
func (s *Store) BlobDigest(ctx context.Context, digest string) (string, int64, error) {
	h := sha256.New()
	cw := &countingWriter{w: h}
	if err := s.WriteBlob(ctx, cw, digest); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

// ErrBlobMismatch is wrapped by ImportBlob's error when the blob read does
// not hash to the expected value.
var ErrBlobMismatch = errors.New("layer blob digest mismatch")

// ImportBlob stores layer digest from its blob r, read to at most max
// bytes, hashing the stream as it is extracted. Nothing is stored unless
// the whole stream hashes to wantBlob (a mismatch wraps ErrBlobMismatch,
// kind InvalidArgument); a layer already stored is returned as is.
func (s *Store) ImportBlob(ctx context.Context, digest, wantBlob string, r io.Reader, max int64) (Layer, error) {
	if err := ValidateDigest(digest); err != nil {
		return Layer{}, err
	}
	if ValidateDigest(wantBlob) != nil {
		return Layer{}, errs.Field("blob_digest", "%q is not 64 lowercase hex characters", wantBlob)
	}
	if s.HasLayer(digest) {
		return s.Layer(digest)
	}
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
	lr := &io.LimitedReader{R: r, N: max + 1}
	h := sha256.New()
	cr := &countingHashReader{r: lr, h: h}
	st, err := extractTar(ctx, cr, tmp, func(int64) {}, s.log)
	if err == nil {
		_, err = io.Copy(io.Discard, cr) // the padding after the end marker is hashed too
	}
	if cr.n > max {
		return Layer{}, errs.E(errs.ResourceExhausted, "layer %s: blob larger than %d bytes", digest, max)
	}
	if err != nil {
		return Layer{}, errs.Wrap(errs.KindOf(err), err, "layer %s: read blob", digest)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantBlob {
		return Layer{}, errs.Wrap(errs.InvalidArgument, ErrBlobMismatch, "layer %s: blob hashes to %s, want %s (%d bytes read)",
			digest, got, wantBlob, cr.n)
	}
	if s.HasLayer(digest) {
		return s.Layer(digest)
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
	s.log.Info("layer imported from blob", "digest", digest, "blob_bytes", l.TarSize, "entries", l.Entries)
	return l, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

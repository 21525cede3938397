package template

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// Store is the content-addressed layer store under <dataDir>/layers.
//
// A layer is a read-only rootfs directory at layers/<digest>/, where digest
// is the lowercase hex sha256 of the layer's uncompressed tar stream exactly
// as it was imported (a gzip-compressed input is hashed after
// decompression, so the same tar gzipped or not is the same layer). Importing
// the same tar stream twice yields the same layer; a re-packed tar of the
// same files (different order or timestamps) is a different layer. Layers
// stored from a directory (ImportDir, for snapshots) are named by
// TreeDigest of their content instead, and a checkpoint's delta
// (ImportDirNamed) by a digest its caller derived from the checkpoint's id;
// all are sha256 and share the namespace.
//
// Layers appear atomically: a layer is extracted into layers/.tmp-* and
// renamed into place, so layers/<digest>/ either exists complete or not at
// all. Beside each layer, layers/<digest>.json records its size and import
// time. The store does not know which templates or sandboxes use a layer;
// callers remove a layer only when nothing references it.
type Store struct {
	dir string // <dataDir>/layers
	log *slog.Logger
}

// Layer describes one stored layer.
type Layer struct {
	Digest    string    `json:"digest"`     // lowercase hex sha256 of the tar stream
	Path      string    `json:"path"`       // rootfs directory
	TarSize   int64     `json:"tar_size"`   // bytes of the uncompressed tar stream (ImportDir: of regular files)
	Entries   int64     `json:"entries"`    // tar entries extracted
	Skipped   int64     `json:"skipped"`    // device nodes, fifos and other entries not extracted
	CreatedAt time.Time `json:"created_at"` // when it was imported
}

const tmpPrefix = ".tmp-"

var digestRE = lazyregexp.New(`^[0-9a-f]{64}$`)

// ValidateDigest checks a layer digest: 64 lowercase hex characters (no
// "sha256:" prefix).
func ValidateDigest(d string) error {
	if !digestRE.MatchString(d) {
		return errs.Field("digest", "%q is not 64 lowercase hex characters", d)
	}
	return nil
}

// Open opens (creating if needed) the layer store in dataDir and removes
// leftovers of imports interrupted by a crash.
func Open(dataDir string, log *slog.Logger) (*Store, error) {
	if dataDir == "" {
		return nil, errs.Field("data_dir", "must not be empty")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Join(dataDir, "layers")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "create layer dir")
	}
	s := &Store{dir: dir, log: log}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read layer dir")
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			p := filepath.Join(dir, e.Name())
			log.Info("removing interrupted layer import", "path", p)
			if err := os.RemoveAll(p); err != nil {
				log.Warn("remove interrupted layer import", "path", p, "err", err)
			}
		}
	}
	return s, nil
}

// Dir is the directory holding the layers.
func (s *Store) Dir() string { return s.dir }

// LayerPath is where layer digest's rootfs is (whether or not it exists).
func (s *Store) LayerPath(digest string) string { return filepath.Join(s.dir, digest) }

// HasLayer reports whether layer digest is stored.
func (s *Store) HasLayer(digest string) bool {
	if ValidateDigest(digest) != nil {
		return false
	}
	fi, err := os.Lstat(s.LayerPath(digest))
	return err == nil && fi.IsDir()
}

// Layer returns one stored layer; errs.NotFound if it is not stored.
func (s *Store) Layer(digest string) (Layer, error) {
	if err := ValidateDigest(digest); err != nil {
		return Layer{}, err
	}
	if !s.HasLayer(digest) {
		return Layer{}, errs.E(errs.NotFound, "layer %s not found", digest)
	}
	l := Layer{Digest: digest}
	if b, err := os.ReadFile(s.metaPath(digest)); err == nil {
		if err := json.Unmarshal(b, &l); err != nil {
			s.log.Warn("bad layer metadata", "digest", digest, "err", err)
		}
	}
	l.Digest, l.Path = digest, s.LayerPath(digest)
	return l, nil
}

// ListLayers returns every stored layer, ordered by digest.
func (s *Store) ListLayers() ([]Layer, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read layer dir")
	}
	var out []Layer
	for _, e := range ents {
		if !e.IsDir() || ValidateDigest(e.Name()) != nil {
			continue
		}
		l, err := s.Layer(e.Name())
		if errs.Is(err, errs.NotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	return out, nil
}

// RemoveLayer deletes a layer; errs.NotFound if it is not stored. The
// directory is first renamed away, so a concurrent reader never sees half a
// layer under its digest.
func (s *Store) RemoveLayer(digest string) error {
	if err := ValidateDigest(digest); err != nil {
		return err
	}
	if !s.HasLayer(digest) {
		return errs.E(errs.NotFound, "layer %s not found", digest)
	}
	trash, err := os.MkdirTemp(s.dir, tmpPrefix+"rm-")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "remove layer %s", digest)
	}
	moved := filepath.Join(trash, digest)
	if err := os.Rename(s.LayerPath(digest), moved); err != nil {
		_ = os.Remove(trash)
		if errors.Is(err, fs.ErrNotExist) {
			return errs.E(errs.NotFound, "layer %s not found", digest)
		}
		return errs.Wrap(errs.Internal, err, "remove layer %s", digest)
	}
	_ = os.Remove(s.metaPath(digest))
	if err := os.RemoveAll(trash); err != nil {
		return errs.Wrap(errs.Internal, err, "remove layer %s", digest)
	}
	s.log.Info("layer removed", "digest", digest)
	return nil
}

func (s *Store) metaPath(digest string) string { return filepath.Join(s.dir, digest+".json") }

// ImportFile imports a tar file (see ImportTar). When a "<path>.sha256"
// file written by BuildDefault/BuildTiny names a layer already stored, the
// tar is not read again.
func (s *Store) ImportFile(ctx context.Context, path string, progress func(Progress)) (Layer, error) {
	if b, err := os.ReadFile(path + ".sha256"); err == nil {
		d := strings.TrimSpace(string(b))
		if s.HasLayer(d) {
			return s.Layer(d)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Layer{}, errs.Wrap(errs.NotFound, err, "open layer tar")
		}
		return Layer{}, errs.Wrap(errs.Internal, err, "open layer tar")
	}
	defer f.Close()
	return s.ImportTar(ctx, f, progress)
}

// ImportTar extracts a rootfs tarball (plain or gzip) into a new layer and
// returns it; if the same tar stream was imported before, it returns the
// existing layer and stores nothing new.
//
// Extraction is confined to the layer directory: an entry whose name or
// hard-link target leaves the root ("../x"), or whose path goes through a
// symlink pointing outside the root or through an absolute symlink, makes
// the import fail with errs.InvalidArgument (field "archive"). Symlinks
// themselves may point anywhere (they are resolved inside the sandbox).
// Ownership (numeric uid/gid, when running as root), modes including
// setuid/setgid/sticky, mtimes, symlinks, hard links and security.capability
// xattrs are preserved; device nodes, fifos and sockets are skipped (the
// runtime provides /dev). Whiteouts are not interpreted.
func (s *Store) ImportTar(ctx context.Context, r io.Reader, progress func(Progress)) (Layer, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix)
	if err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "create import dir")
	}
	ok := false
	defer func() {
		if !ok {
			if err := os.RemoveAll(tmp); err != nil {
				s.log.Warn("remove failed import", "path", tmp, "err", err)
			}
		}
	}()

	br := bufio.NewReaderSize(r, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return Layer{}, errs.Field("archive", "bad gzip stream: %v", err)
		}
		defer zr.Close()
		src = zr
	}
	h := sha256.New()
	cr := &countingHashReader{r: src, h: h}
	st, err := extractTar(ctx, cr, tmp, func(entries int64) {
		progress(Progress{Phase: PhaseImport, Message: fmt.Sprintf("extracted %d entries", entries), Bytes: cr.n})
	}, s.log)
	if err != nil {
		return Layer{}, err
	}
	// The digest covers the whole stream, including padding after the
	// end-of-archive marker.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return Layer{}, errs.Wrap(errs.InvalidArgument, err, "archive: read")
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if s.HasLayer(digest) {
		s.log.Info("layer already stored", "digest", digest)
		return s.Layer(digest)
	}
	l := Layer{Digest: digest, TarSize: cr.n, Entries: st.entries, Skipped: st.skipped, CreatedAt: time.Now().UTC()}
	meta, _ := json.Marshal(l)
	if err := os.WriteFile(s.metaPath(digest), meta, 0o600); err != nil {
		return Layer{}, errs.Wrap(errs.Internal, err, "write layer metadata")
	}
	if err := os.Rename(tmp, s.LayerPath(digest)); err != nil {
		if s.HasLayer(digest) { // a concurrent import of the same content won
			return s.Layer(digest)
		}
		return Layer{}, errs.Wrap(errs.Internal, err, "move layer into place")
	}
	ok = true
	l.Path = s.LayerPath(digest)
	s.log.Info("layer imported", "digest", digest, "tar_bytes", l.TarSize, "entries", l.Entries,
		"skipped", l.Skipped, "duration", time.Since(start).Round(time.Millisecond))
	progress(Progress{Phase: PhaseImport, Message: fmt.Sprintf("imported layer %s (%d entries)", digest[:12], l.Entries), Bytes: l.TarSize})
	return l, nil
}

type countingHashReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *countingHashReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.h.Write(p[:n])
		c.n += int64(n)
	}
	return n, err
}

package fsdiff

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// TarOptions bound what NewTarLayer keeps of a sandbox-written tar.
type TarOptions struct {
	MaxEntries int   // entries in the tar; 0 = 1,000,000
	MaxInline  int64 // a file's content is kept if at most this big; 0 = 1 MiB
	MaxTotal   int64 // content kept in all; 0 = 64 MiB
}

// TarLayer is a layer read from an upper tar (runsc's `tar rootfs-upper`,
// or any tar in overlay notation: whiteouts as char 0/0 entries, opaque dirs
// as SCHILY.xattr.trusted.overlay.opaque records). It is indexed once, in
// memory: every file is hashed while read, and small files keep their
// content so that text diffs need no second pass. Entry names are cleaned
// and may not leave the root; links are resolved within the index only.
type TarLayer struct {
	id      string
	entries map[string]*tarEntry
	dirs    map[string][]string
}

type tarEntry struct {
	Entry
	content []byte // nil: not kept
	kept    bool
}

// NewTarLayer indexes the tar r as the layer id.
func NewTarLayer(id string, r io.Reader, o TarOptions) (*TarLayer, error) {
	if o.MaxEntries == 0 {
		o.MaxEntries = 1_000_000
	}
	if o.MaxInline == 0 {
		o.MaxInline = 1 << 20
	}
	if o.MaxTotal == 0 {
		o.MaxTotal = 64 << 20
	}
	l := &TarLayer{id: id, entries: map[string]*tarEntry{".": {Entry: Entry{Node: Node{Type: TypeDir, Mode: 0o755}}}}, dirs: map[string][]string{}}
	var total int64
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, err, "upper tar %s", id)
		}
		if n >= o.MaxEntries {
			return nil, errs.E(errs.ResourceExhausted, "upper tar %s has more than %d entries", id, o.MaxEntries)
		}
		rel, err := cleanTarName(hdr.Name)
		if err != nil {
			return nil, err
		}
		if skipEntry(rel) {
			continue
		}
		if sparse(hdr) {
			// A sparse entry's size is a claim, not bytes in the stream: a
			// few bytes of tar could make us hash a terabyte of zeros.
			// runsc never writes one.
			return nil, errs.Field("archive", "entry %q is a sparse file", hdr.Name)
		}
		e := &tarEntry{Entry: Entry{Node: Node{Mode: uint32(hdr.Mode) & 0o7777, UID: uint32(hdr.Uid), GID: uint32(hdr.Gid)}}}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.Type = TypeDir
			e.Opaque = hdr.PAXRecords["SCHILY.xattr."+opaqueXattr] == "y"
		case tar.TypeReg, tar.TypeRegA:
			e.Type, e.Size = TypeFile, hdr.Size
			h := sha256.New()
			var buf bytes.Buffer
			keep := hdr.Size <= o.MaxInline && total+hdr.Size <= o.MaxTotal
			w := io.Writer(h)
			if keep {
				w = io.MultiWriter(h, &buf)
			}
			if _, err := io.Copy(w, tr); err != nil {
				return nil, errs.Wrap(errs.InvalidArgument, err, "upper tar %s: %s", id, hdr.Name)
			}
			e.SHA256 = hex.EncodeToString(h.Sum(nil))
			if keep {
				e.content, e.kept = buf.Bytes(), true
				total += hdr.Size
			}
		case tar.TypeLink:
			target, err := cleanTarName(hdr.Linkname)
			if err != nil {
				return nil, err
			}
			t, ok := l.entries[target]
			if !ok || t.Type != TypeFile {
				return nil, errs.Field("archive", "hard link %q to %q, which is not an earlier regular file", hdr.Name, hdr.Linkname)
			}
			c := *t
			e = &c
		case tar.TypeSymlink:
			e.Type, e.Target = TypeSymlink, hdr.Linkname
			e.Size = int64(len(hdr.Linkname))
		case tar.TypeFifo:
			e.Type = TypeFIFO
		case tar.TypeChar:
			if hdr.Devmajor == 0 && hdr.Devminor == 0 {
				e.Entry = Entry{Whiteout: true}
			} else {
				e.Type = TypeDevice
			}
		case tar.TypeBlock:
			e.Type = TypeDevice
		default:
			continue // pax globals, GNU extensions: no object
		}
		l.add(rel, e)
	}
	for d := range l.dirs {
		sort.Strings(l.dirs[d])
	}
	return l, nil
}

// add records e at rel, making missing parent directories (a tar may omit
// them) as plain, non-opaque directories.
func (l *TarLayer) add(rel string, e *tarEntry) {
	if rel == "." {
		if e.Type == TypeDir {
			l.entries["."] = e
		}
		return
	}
	if _, seen := l.entries[rel]; !seen {
		parent := parentOf(rel)
		if _, ok := l.entries[parent]; !ok {
			l.add(parent, &tarEntry{Entry: Entry{Node: Node{Type: TypeDir, Mode: 0o755}}})
		}
		l.dirs[parent] = append(l.dirs[parent], path.Base(rel))
	}
	l.entries[rel] = e // a later entry for the same name replaces the earlier (tar semantics)
}

func sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func cleanTarName(name string) (string, error) {
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errs.Field("archive", "entry %q leaves the root", name)
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// ID implements Layer.
func (l *TarLayer) ID() string { return l.id }

// Lstat implements Layer.
func (l *TarLayer) Lstat(rel string) (Entry, bool, error) {
	e, ok := l.entries[rel]
	if !ok {
		return Entry{}, false, nil
	}
	return e.Entry, true, nil
}

// ReadDir implements Layer.
func (l *TarLayer) ReadDir(rel string) ([]string, error) {
	if e, ok := l.entries[rel]; !ok || e.Type != TypeDir {
		return nil, nil
	}
	return l.dirs[rel], nil
}

// Open implements Layer. Content larger than TarOptions.MaxInline was
// hashed but not kept: opening it is FailedPrecondition (extract the tar
// with rootfs.ExtractUpperTar and use a DirLayer for such content).
func (l *TarLayer) Open(rel string) (io.ReadCloser, error) {
	e, ok := l.entries[rel]
	if !ok {
		return nil, errs.E(errs.NotFound, "%q is not in upper tar %s", rel, l.id)
	}
	if e.Type != TypeFile {
		return nil, errs.E(errs.PermissionDenied, "%q in upper tar %s is not a regular file", rel, l.id)
	}
	if !e.kept {
		return nil, errs.E(errs.FailedPrecondition, "content of %q in upper tar %s was not kept (%d bytes)", rel, l.id, e.Size)
	}
	return io.NopCloser(bytes.NewReader(e.content)), nil
}

func (l *TarLayer) sha256(rel string) (string, bool) {
	e, ok := l.entries[rel]
	if !ok || e.Type != TypeFile {
		return "", false
	}
	return e.SHA256, true
}

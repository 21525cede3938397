package fsdiff

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"path"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Tree is the merged view of a stack of layers, top first, the way
// overlayfs presents it: the topmost layer holding a path wins, a whiteout
// deletes the path for the layers below, an opaque directory or a
// non-directory hides everything below it in lower layers.
type Tree struct {
	layers []Layer
	cache  []map[string]lstatResult // per layer
}

type lstatResult struct {
	e  Entry
	ok bool
}

// NewTree is the view of layers, top first (an upper, then the snapshot
// and template layers beneath it).
func NewTree(layers ...Layer) *Tree {
	t := &Tree{layers: layers, cache: make([]map[string]lstatResult, len(layers))}
	for i := range t.cache {
		t.cache[i] = map[string]lstatResult{}
	}
	return t
}

// Layers returns the tree's layers, top first.
func (t *Tree) Layers() []Layer { return t.layers }

func (t *Tree) lstat(i int, rel string) (Entry, bool, error) {
	if r, ok := t.cache[i][rel]; ok {
		return r.e, r.ok, nil
	}
	e, ok, err := t.layers[i].Lstat(rel)
	if err != nil {
		return Entry{}, false, err
	}
	t.cache[i][rel] = lstatResult{e, ok}
	return e, ok, nil
}

// lookup resolves rel in the merged view: the node, the index of the layer
// it comes from, and whether it exists.
func (t *Tree) lookup(rel string) (Node, int, bool, error) {
	if rel == "." || rel == "" {
		for i := range t.layers {
			if e, ok, err := t.lstat(i, "."); err != nil {
				return Node{}, 0, false, err
			} else if ok {
				return e.Node, i, true, nil
			}
		}
		return Node{Type: TypeDir, Mode: 0o755}, -1, true, nil
	}
	parts := strings.Split(rel, "/")
layers:
	for i := range t.layers {
		stop := false // an opaque ancestor in this layer hides the layers below
		for k := 1; k < len(parts); k++ {
			e, ok, err := t.lstat(i, strings.Join(parts[:k], "/"))
			if err != nil {
				return Node{}, 0, false, err
			}
			if !ok {
				if stop {
					return Node{}, 0, false, nil
				}
				continue layers // not in this layer; maybe below
			}
			if e.Whiteout || e.Type != TypeDir {
				return Node{}, 0, false, nil // deleted or replaced here
			}
			stop = stop || e.Opaque
		}
		e, ok, err := t.lstat(i, rel)
		if err != nil {
			return Node{}, 0, false, err
		}
		if ok {
			if e.Whiteout {
				return Node{}, 0, false, nil
			}
			return e.Node, i, true, nil
		}
		if stop {
			return Node{}, 0, false, nil
		}
	}
	return Node{}, 0, false, nil
}

// Lookup reports the node at rel in the merged view ("" or "." is the
// root), false if there is none.
func (t *Tree) Lookup(rel string) (Node, bool, error) {
	rel, err := cleanRel(rel)
	if err != nil {
		return Node{}, false, err
	}
	n, _, ok, err := t.lookup(rel)
	return n, ok, err
}

// readDir lists the names of the merged directory rel.
func (t *Tree) readDir(rel string) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for i, l := range t.layers {
		ns, err := l.ReadDir(rel)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			if seen[n] {
				continue
			}
			seen[n] = true
			if _, _, ok, err := t.lookup(join(rel, n)); err != nil {
				return nil, err
			} else if ok {
				names = append(names, n)
			}
		}
		// Below an opaque or replacing entry nothing more shows.
		if e, ok, err := t.lstat(i, rel); err != nil {
			return nil, err
		} else if ok && (e.Opaque || e.Whiteout || e.Type != TypeDir) {
			break
		}
	}
	return names, nil
}

// hash returns the SHA-256 of the regular file rel of layer i.
func (t *Tree) hash(i int, rel string) (string, error) {
	if h, ok := t.layers[i].(hasher); ok {
		if s, ok := h.sha256(rel); ok {
			return s, nil
		}
	}
	f, err := t.layers[i].Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", errs.Wrap(errs.Internal, err, "hash %q", rel)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ReadFile reads the regular file rel of the merged view, refusing one
// larger than max bytes (ResourceExhausted) and anything but a regular
// file (PermissionDenied).
func (t *Tree) ReadFile(rel string, max int64) ([]byte, error) {
	rel, err := cleanRel(rel)
	if err != nil {
		return nil, err
	}
	n, i, ok, err := t.lookup(rel)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errs.E(errs.NotFound, "%q does not exist", rel)
	}
	return t.read(i, rel, n, max)
}

func (t *Tree) read(i int, rel string, n Node, max int64) ([]byte, error) {
	if n.Type != TypeFile {
		return nil, errs.E(errs.PermissionDenied, "%q is a %s, not a regular file", rel, n.Type)
	}
	if n.Size > max {
		return nil, errs.E(errs.ResourceExhausted, "%q is larger than %d bytes", rel, max)
	}
	f, err := t.layers[i].Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "read %q", rel)
	}
	if int64(len(b)) > max {
		return nil, errs.E(errs.ResourceExhausted, "%q is larger than %d bytes", rel, max)
	}
	return b, nil
}

// Open opens the regular file rel of the merged view for reading (the
// daemon copies large content with it when applying a merge).
func (t *Tree) Open(rel string) (io.ReadCloser, Node, error) {
	rel, err := cleanRel(rel)
	if err != nil {
		return nil, Node{}, err
	}
	n, i, ok, err := t.lookup(rel)
	if err != nil {
		return nil, Node{}, err
	}
	if !ok {
		return nil, Node{}, errs.E(errs.NotFound, "%q does not exist", rel)
	}
	if n.Type != TypeFile {
		return nil, Node{}, errs.E(errs.PermissionDenied, "%q is a %s, not a regular file", rel, n.Type)
	}
	f, err := t.layers[i].Open(rel)
	return f, n, err
}

// Hash returns the SHA-256 of the regular file rel of the merged view.
func (t *Tree) Hash(rel string) (string, error) {
	rel, err := cleanRel(rel)
	if err != nil {
		return "", err
	}
	n, i, ok, err := t.lookup(rel)
	if err != nil {
		return "", err
	}
	if !ok || n.Type != TypeFile {
		return "", errs.E(errs.NotFound, "%q is not a regular file", rel)
	}
	return t.hash(i, rel)
}

func cleanRel(name string) (string, error) {
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errs.Field("path", "%q has a \"..\" component", name)
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

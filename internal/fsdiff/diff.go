package fsdiff

import (
	"bytes"
	"context"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff/linediff"
)

// Kind is what happened to a path between the two views.
type Kind string

// Change kinds. A rename is reported as a deletion and an addition, linked
// by RenamedFrom/RenamedTo when the content is identical.
const (
	Added    Kind = "added"
	Deleted  Kind = "deleted"
	Modified Kind = "modified"
)

// Change is one path that differs between the two views.
type Change struct {
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	Old  *Node  `json:"old,omitempty"` // nil when added
	New  *Node  `json:"new,omitempty"` // nil when deleted

	ContentChanged bool `json:"content_changed,omitempty"`
	ModeChanged    bool `json:"mode_changed,omitempty"`
	OwnerChanged   bool `json:"owner_changed,omitempty"`
	TypeChanged    bool `json:"type_changed,omitempty"`

	// Binary is set for a regular file whose content is not text (or too
	// large to diff as text): compare sizes and SHA256 instead.
	Binary bool `json:"binary,omitempty"`
	// Refused says why the object was not examined (a device node).
	Refused string `json:"refused,omitempty"`

	RenamedFrom string `json:"renamed_from,omitempty"`
	RenamedTo   string `json:"renamed_to,omitempty"`

	LinesAdded   int    `json:"lines_added,omitempty"`
	LinesRemoved int    `json:"lines_removed,omitempty"`
	Unified      string `json:"unified,omitempty"`
	// TextOmitted says why a text change has no Unified diff.
	TextOmitted string `json:"text_omitted,omitempty"`
}

// Result is a diff: its changes in path order.
type Result struct {
	Changes []Change `json:"changes"`
	Stat    Stat     `json:"stat"`
}

// Stat sums a diff up, like `git diff --stat`'s last line.
type Stat struct {
	Files        int `json:"files"`
	Added        int `json:"added"`
	Deleted      int `json:"deleted"`
	Modified     int `json:"modified"`
	LinesAdded   int `json:"lines_added"`
	LinesRemoved int `json:"lines_removed"`
}

// Options shape a diff.
type Options struct {
	// Paths keeps only changes at or below these paths, or matching them
	// as path.Match patterns ("src", "*.go", "src/*/main.go"). Empty: all.
	Paths []string
	// NoText skips unified text diffs but still counts changed lines
	// (what --stat shows).
	NoText bool
	// DigestsOnly reads no content beyond what digests need: no line
	// counts, no text/binary verdict (a merge plan, compare's sizes).
	DigestsOnly bool
	// QuickCheck decides whether a regular file of the same size in both
	// views changed without reading either: it is unchanged only when
	// the from side's layer recorded, when berth copied the file there,
	// the stat stamp (StatStamp: device, inode, size, mtime, ctime) that
	// the to side's file has now (a Layer that can tell, such as
	// DirLayer; see StampXattr); anything else is modified. No digests
	// are computed (Node.SHA256 stays empty), no text is read and
	// renames are not linked. It may call an unchanged file modified,
	// never the reverse: for a checkpoint's delta against layers berth
	// wrote, where an extra copy costs time and never correctness. The
	// exact answer `berth diff` gives users is without it.
	QuickCheck bool
	// MaxTextBytes is the largest file (per side) diffed as text; larger
	// ones are reported as binary. 0 = 1 MiB.
	MaxTextBytes int64
	// Context lines around each unified hunk. 0 = 3; negative = none.
	Context int
	// MaxEntries bounds the paths examined (entries of the unshared
	// layers plus the subtrees they delete). 0 = 1,000,000.
	MaxEntries int
}

func (o *Options) defaults() {
	if o.MaxTextBytes == 0 {
		o.MaxTextBytes = 1 << 20
	}
	if o.Context == 0 {
		o.Context = 3
	} else if o.Context < 0 {
		o.Context = 0
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = 1_000_000
	}
}

// Diff computes the changes that turn view from into view to. Layers the
// two share at the bottom of their stacks (same Layer.ID) are never
// walked: only the entries of the other layers, and the subtrees their
// whiteouts, opaque directories or replacements hide, are looked up in
// both views.
func Diff(ctx context.Context, from, to *Tree, o Options) (*Result, error) {
	o.defaults()
	for _, p := range o.Paths {
		if _, err := path.Match(p, ""); err != nil {
			return nil, errs.Field("paths", "bad pattern %q: %v", p, err)
		}
	}
	d := &differ{ctx: ctx, from: from, to: to, o: o, touched: map[string]bool{}}
	if err := d.collect(); err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(d.touched))
	for p := range d.touched {
		if p != "." && d.keep(p) {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	res := &Result{}
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, ok, err := d.compare(p)
		if err != nil {
			return nil, err
		}
		if ok {
			res.Changes = append(res.Changes, c)
		}
	}
	if !o.QuickCheck {
		if err := d.renames(res.Changes); err != nil {
			return nil, err
		}
	}
	res.Stat = Summarize(res.Changes)
	return res, nil
}

// Summarize counts changes.
func Summarize(changes []Change) Stat {
	var s Stat
	for _, c := range changes {
		s.Files++
		switch c.Kind {
		case Added:
			s.Added++
		case Deleted:
			s.Deleted++
		default:
			s.Modified++
		}
		s.LinesAdded += c.LinesAdded
		s.LinesRemoved += c.LinesRemoved
	}
	return s
}

type differ struct {
	ctx      context.Context
	from, to *Tree
	o        Options
	touched  map[string]bool
}

// unshared returns the layers of t above the bottom run it shares with u.
func unshared(t, u *Tree) []Layer {
	a, b := t.layers, u.layers
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n].ID() == b[len(b)-1-n].ID() {
		n++
	}
	return slices.Clone(a[:len(a)-n])
}

func (d *differ) add(p string) error {
	if !d.touched[p] {
		if len(d.touched) >= d.o.MaxEntries {
			return errs.E(errs.ResourceExhausted, "diff examines more than %d paths", d.o.MaxEntries)
		}
		d.touched[p] = true
	}
	return nil
}

// collect gathers every path an unshared layer of either view holds, and
// expands the subtrees such an entry may hide (a whiteout, an opaque
// directory, a non-directory over a directory) in both views.
func (d *differ) collect() error {
	var hiders []string
	for _, l := range append(unshared(d.from, d.to), unshared(d.to, d.from)...) {
		err := walkLayer(d.ctx, l, ".", func(rel string, e Entry) error {
			if e.Whiteout || e.Opaque || e.Type != TypeDir {
				hiders = append(hiders, rel)
			}
			return d.add(rel)
		})
		if err != nil {
			return err
		}
	}
	for _, h := range hiders {
		for _, t := range []*Tree{d.from, d.to} {
			if err := d.expand(t, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// walkLayer visits every entry of layer l below rel, parents first.
func walkLayer(ctx context.Context, l Layer, rel string, fn func(string, Entry) error) error {
	names, err := l.ReadDir(rel)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := join(rel, n)
		e, ok, err := l.Lstat(p)
		if err != nil {
			return err
		}
		if !ok {
			continue // went away while we looked (a live upper)
		}
		if err := fn(p, e); err != nil {
			return err
		}
		if e.Type == TypeDir && !e.Whiteout {
			if err := walkLayer(ctx, l, p, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// expand adds every path below rel in view t, if rel is a directory there.
func (d *differ) expand(t *Tree, rel string) error {
	n, _, ok, err := t.lookup(rel)
	if err != nil || !ok || n.Type != TypeDir {
		return err
	}
	names, err := t.readDir(rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		p := join(rel, name)
		if err := d.add(p); err != nil {
			return err
		}
		if err := d.expand(t, p); err != nil {
			return err
		}
	}
	return nil
}

// keep applies Options.Paths.
func (d *differ) keep(p string) bool {
	if len(d.o.Paths) == 0 {
		return true
	}
	for _, f := range d.o.Paths {
		f = strings.Trim(path.Clean("/"+f), "/")
		if f == "" || p == f || strings.HasPrefix(p, f+"/") {
			return true
		}
		if ok, _ := path.Match(f, p); ok {
			return true
		}
		if ok, _ := path.Match(f, path.Base(p)); ok && !strings.Contains(f, "/") {
			return true
		}
	}
	return false
}

// compare looks p up in both views and describes the difference.
func (d *differ) compare(p string) (Change, bool, error) {
	a, ai, aok, err := d.from.lookup(p)
	if err != nil {
		return Change{}, false, err
	}
	b, bi, bok, err := d.to.lookup(p)
	if err != nil {
		return Change{}, false, err
	}
	c := Change{Path: p}
	switch {
	case !aok && !bok:
		return c, false, nil
	case !aok:
		c.Kind, c.New = Added, &b
	case !bok:
		c.Kind, c.Old = Deleted, &a
	default:
		c.Kind, c.Old, c.New = Modified, &a, &b
		c.TypeChanged = a.Type != b.Type
		c.ModeChanged = a.Mode != b.Mode && a.Type != TypeSymlink && b.Type != TypeSymlink
		c.OwnerChanged = a.UID != b.UID || a.GID != b.GID
		if !c.TypeChanged {
			switch a.Type {
			case TypeSymlink:
				c.ContentChanged = a.Target != b.Target
			case TypeFile:
				same, err := d.sameContent(ai, bi, p, c.Old, c.New)
				if err != nil {
					return c, false, err
				}
				c.ContentChanged = !same
			}
		}
		if !c.TypeChanged && !c.ModeChanged && !c.OwnerChanged && !c.ContentChanged {
			return c, false, nil
		}
	}
	if (c.Old != nil && c.Old.Type == TypeDevice) || (c.New != nil && c.New.Type == TypeDevice) {
		c.Refused = "device node: reported, never opened"
		return c, true, nil
	}
	if err := d.text(&c, ai, bi); err != nil {
		return c, false, err
	}
	return c, true, nil
}

// sameContent compares two regular files: equal if they come from the
// same shared layer, different if their sizes differ, else by digest.
// Digests of both are recorded on the nodes.
func (d *differ) sameContent(ai, bi int, p string, a, b *Node) (bool, error) {
	if ai >= 0 && bi >= 0 && d.from.layers[ai].ID() == d.to.layers[bi].ID() && sharedAt(d.from, ai, d.to, bi) {
		return true, nil
	}
	if d.o.QuickCheck {
		return a.Size == b.Size && d.stampsMatch(ai, bi, p), nil
	}
	var err error
	if b.SHA256 == "" {
		if b.SHA256, err = d.to.hash(bi, p); err != nil {
			return false, err
		}
	}
	if a.Size != b.Size {
		return false, nil
	}
	if a.SHA256 == "" {
		if a.SHA256, err = d.from.hash(ai, p); err != nil {
			return false, err
		}
	}
	return a.SHA256 == b.SHA256, nil
}

// stampsMatch says (Options.QuickCheck) that the from side's file p
// (layer ai) is a copy berth made of the to side's file p (layer bi) as it
// is now: the stamp recorded on the copy is the live one of the original.
// Any error, or a layer that cannot tell, is "no".
func (d *differ) stampsMatch(ai, bi int, p string) bool {
	if ai < 0 || bi < 0 {
		return false
	}
	from, ok1 := d.from.layers[ai].(stamper)
	to, ok2 := d.to.layers[bi].(stamper)
	if !ok1 || !ok2 {
		return false
	}
	rec, err := from.recordedStamp(p)
	if err != nil || rec == "" {
		return false
	}
	live, err := to.liveStamp(p)
	return err == nil && live == rec
}

// sharedAt says layer ai of t and bi of u are the same layer of the shared
// bottom run (the same ID higher up could be a coincidence of naming).
func sharedAt(t *Tree, ai int, u *Tree, bi int) bool {
	return len(t.layers)-ai == len(u.layers)-bi && ai >= len(unshared(t, u))
}

// text fills in the unified diff (or the binary verdict) of a regular
// file's content change, and the digest of new content.
func (d *differ) text(c *Change, ai, bi int) error {
	isFile := func(n *Node) bool { return n != nil && n.Type == TypeFile }
	if !isFile(c.Old) && !isFile(c.New) {
		return nil
	}
	if d.o.QuickCheck {
		return nil
	}
	if isFile(c.New) && c.New.SHA256 == "" {
		h, err := d.to.hash(bi, c.Path)
		if err != nil {
			return err
		}
		c.New.SHA256 = h
	}
	if d.o.DigestsOnly || (c.Kind == Modified && !c.ContentChanged && !c.TypeChanged) {
		return nil
	}
	var oldText, newText []byte
	read := func(t *Tree, i int, n *Node) ([]byte, bool, error) {
		if !isFile(n) {
			return nil, true, nil
		}
		if n.Size > d.o.MaxTextBytes {
			c.Binary, c.TextOmitted = true, "larger than the text limit"
			return nil, false, nil
		}
		b, err := t.read(i, c.Path, *n, d.o.MaxTextBytes)
		if errs.Is(err, errs.FailedPrecondition) { // a tar layer that kept no content
			c.Binary, c.TextOmitted = true, "content not kept"
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			c.Binary, c.TextOmitted = true, ""
			return nil, false, nil
		}
		return b, true, nil
	}
	var ok bool
	var err error
	if oldText, ok, err = read(d.from, ai, c.Old); err != nil || !ok {
		return err
	}
	if newText, ok, err = read(d.to, bi, c.New); err != nil || !ok {
		return err
	}
	a, b := linediff.Split(oldText), linediff.Split(newText)
	if d.o.NoText {
		for _, h := range linediff.Hunks(a, b) {
			c.LinesRemoved += h.A1 - h.A0
			c.LinesAdded += h.B1 - h.B0
		}
		return nil
	}
	aName, bName := "a/"+c.Path, "b/"+c.Path
	if !isFile(c.Old) {
		aName = "/dev/null"
	}
	if !isFile(c.New) {
		bName = "/dev/null"
	}
	c.Unified, c.LinesAdded, c.LinesRemoved = linediff.Unified(aName, bName, a, b, d.o.Context)
	return nil
}

// renames links a deleted regular file to an added one with the same
// content (the first such pair in path order).
func (d *differ) renames(changes []Change) error {
	bySize := map[int64][]int{}
	for i, c := range changes {
		if c.Kind == Deleted && c.Old.Type == TypeFile {
			bySize[c.Old.Size] = append(bySize[c.Old.Size], i)
		}
	}
	if len(bySize) == 0 {
		return nil
	}
	for i := range changes {
		add := &changes[i]
		if add.Kind != Added || add.New.Type != TypeFile {
			continue
		}
		for _, j := range bySize[add.New.Size] {
			del := &changes[j]
			if del.RenamedTo != "" {
				continue
			}
			if del.Old.SHA256 == "" {
				h, err := d.from.Hash(del.Path)
				if err != nil {
					return err
				}
				del.Old.SHA256 = h
			}
			if del.Old.SHA256 == add.New.SHA256 {
				del.RenamedTo, add.RenamedFrom = add.Path, del.Path
				break
			}
		}
	}
	return nil
}

// Package merge computes the three-way merge of a child sandbox's changes
// ("theirs") into its parent ("ours") against their fork point ("base"),
// as a plan: the files to write and delete, and the conflicts, as data.
// The daemon applies a plan atomically under a brief freeze of the target
// and stores its conflicts; resolving one (by side or by content, Resolve)
// turns it into writes of the same shape. Nothing here touches a sandbox:
// the three views are fsdiff.Trees over layers, and the package owns no
// state or lock.
//
// Rules, per path, where both sides changed it:
//   - regular text files are merged line-wise (Lines, diff3): edits of
//     different lines merge cleanly, edits of the same lines conflict;
//   - binary files, symlink targets, modes and owners conflict unless one
//     side left them as they were in base (or both made the same change);
//   - a deletion against any other change conflicts, as does a change of
//     type (file, dir, symlink) against a different change.
//
// Strategy three-way stops at conflicts; ours and theirs settle every
// conflict for that side (for text, region by region, like git's -X).
package merge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
)

// Strategy says how conflicts are settled.
type Strategy string

// Strategies.
const (
	ThreeWay Strategy = "three-way" // conflicts are reported, not settled
	Ours     Strategy = "ours"      // conflicts keep the target's version
	Theirs   Strategy = "theirs"    // conflicts take the child's version
)

// ParseStrategy checks a strategy name ("" is three-way).
func ParseStrategy(s string) (Strategy, error) {
	switch Strategy(s) {
	case "", ThreeWay:
		return ThreeWay, nil
	case Ours, Theirs:
		return Strategy(s), nil
	}
	return "", errs.Field("strategy", "unknown strategy %q (want three-way, ours or theirs)", s)
}

// Side names one of the three views.
type Side string

// Sides.
const (
	SideBase   Side = "base"
	SideOurs   Side = "ours"
	SideTheirs Side = "theirs"
)

// Inputs are the three views of a merge: the fork point, the target
// (ours, usually the parent) and the source (theirs, usually the child).
type Inputs struct {
	Base, Ours, Theirs *fsdiff.Tree
}

// Options shape a merge.
type Options struct {
	Strategy Strategy
	// Paths limits the merge to these paths (fsdiff.Options.Paths).
	Paths []string
	// MaxTextBytes is the largest file merged line-wise (per side);
	// larger ones merge as binary. 0 = 1 MiB.
	MaxTextBytes int64
}

// Write makes Path become Node. A regular file's content is Content when
// set (a line merge's result or a resolution's text), else the file at
// Path in the view From; MetaOnly keeps the content the target has and
// changes only mode and owner. A directory that exists is only chmod/
// chowned. Expect is the target's node the plan was computed against (nil:
// absent): the applier checks it under the freeze and re-plans if the
// target moved on.
type Write struct {
	Path     string       `json:"path"`
	Node     fsdiff.Node  `json:"node"`
	Content  []byte       `json:"content,omitempty"`
	From     Side         `json:"from,omitempty"`
	MetaOnly bool         `json:"meta_only,omitempty"`
	Expect   *fsdiff.Node `json:"expect,omitempty"`
}

// Delete removes Path (a file, symlink or empty directory; never
// recursive: every entry to go is listed). Expect as in Write.
type Delete struct {
	Path   string       `json:"path"`
	Expect *fsdiff.Node `json:"expect,omitempty"`
}

// Plan is a merge's result: apply Deletes (in order: deepest first), then
// Writes (in order: parents first), all or nothing. Conflicts are what is
// left to resolve; a plan with conflicts is not applied by three-way.
type Plan struct {
	Strategy  Strategy   `json:"strategy"`
	Deletes   []Delete   `json:"deletes"`
	Writes    []Write    `json:"writes"`
	Conflicts []Conflict `json:"conflicts"`
}

// Clean says the plan has no conflicts left.
func (p *Plan) Clean() bool { return len(p.Conflicts) == 0 }

// Touched lists every path the plan writes or deletes, sorted (the daemon
// matches them against files open in the target's processes).
func (p *Plan) Touched() []string {
	var out []string
	for _, d := range p.Deletes {
		out = append(out, d.Path)
	}
	for _, w := range p.Writes {
		out = append(out, w.Path)
	}
	sort.Strings(out)
	return out
}

// Compute plans the merge of theirs into ours against base.
func Compute(ctx context.Context, in Inputs, o Options) (*Plan, error) {
	if in.Base == nil || in.Ours == nil || in.Theirs == nil {
		return nil, errs.E(errs.InvalidArgument, "merge needs base, ours and theirs")
	}
	st, err := ParseStrategy(string(o.Strategy))
	if err != nil {
		return nil, err
	}
	if o.MaxTextBytes == 0 {
		o.MaxTextBytes = 1 << 20
	}
	dopts := fsdiff.Options{Paths: o.Paths, DigestsOnly: true, MaxTextBytes: o.MaxTextBytes}
	dOurs, err := fsdiff.Diff(ctx, in.Base, in.Ours, dopts)
	if err != nil {
		return nil, fmt.Errorf("diff base..ours: %w", err)
	}
	dTheirs, err := fsdiff.Diff(ctx, in.Base, in.Theirs, dopts)
	if err != nil {
		return nil, fmt.Errorf("diff base..theirs: %w", err)
	}
	m := &merger{in: in, o: o, st: st, plan: &Plan{Strategy: st}, ours: index(dOurs), theirs: index(dTheirs)}
	paths := map[string]bool{}
	for p := range m.ours {
		paths[p] = true
	}
	for p := range m.theirs {
		paths[p] = true
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	for _, p := range sorted {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := m.path(p); err != nil {
			return nil, err
		}
	}
	if err := m.parents(); err != nil {
		return nil, err
	}
	if err := m.digestExpects(); err != nil {
		return nil, err
	}
	m.finish()
	return m.plan, nil
}

func index(r *fsdiff.Result) map[string]*fsdiff.Change {
	out := make(map[string]*fsdiff.Change, len(r.Changes))
	for i := range r.Changes {
		out[r.Changes[i].Path] = &r.Changes[i]
	}
	return out
}

type merger struct {
	in           Inputs
	o            Options
	st           Strategy
	plan         *Plan
	ours, theirs map[string]*fsdiff.Change
	// keptOurs are conflicts strategy ours settled: nothing of theirs
	// goes below them.
	keptOurs map[string]bool
}

// oursKeepsBelow says ours added or changed something below dir p (so a
// deletion of p from theirs cannot remove the directory).
func (m *merger) oursKeepsBelow(p string) bool {
	for q, c := range m.ours {
		if strings.HasPrefix(q, p+"/") && c.Kind != fsdiff.Deleted {
			return true
		}
	}
	return false
}

func nodes(c *fsdiff.Change) (base, side *fsdiff.Node) { return c.Old, c.New }

func (m *merger) path(p string) error {
	co, ct := m.ours[p], m.theirs[p]
	switch {
	case ct == nil:
		return nil // only ours changed it: the target has it already
	case co == nil:
		return m.takeTheirs(p, ct)
	}
	b, o := nodes(co)
	_, t := nodes(ct)
	if same(o, t) {
		return nil
	}
	if o == nil || t == nil {
		return m.conflict(p, ConflictDelete, "deleted on one side, changed on the other", b, o, t, nil)
	}
	if o.Type != t.Type {
		return m.conflict(p, ConflictType, fmt.Sprintf("ours made a %s, theirs a %s", o.Type, t.Type), b, o, t, nil)
	}
	r := *o // the result, starting from ours
	var reasons []string
	var kinds []ConflictKind
	pick := func(kind ConflictKind, what string, bv, ov, tv any, set func(fromTheirs bool)) {
		switch {
		case b != nil && ov == bv: // ours left it
			set(true)
		case b != nil && tv == bv, ov == tv: // theirs left it, or the same change
		case m.st == Theirs:
			set(true)
		case m.st == Ours:
		default:
			kinds = append(kinds, kind)
			reasons = append(reasons, what)
		}
	}
	var bMode, bUID, bGID uint32
	var bTarget string
	if b != nil && b.Type == o.Type {
		bMode, bUID, bGID, bTarget = b.Mode, b.UID, b.GID, b.Target
	} else {
		b = nil // a different kind of object in base: treat as added on both sides
	}
	w := Write{Path: p, Expect: o}
	contentFrom := SideOurs
	var content []byte
	var merged []byte
	switch o.Type {
	case fsdiff.TypeFile:
		oc := b == nil || co.ContentChanged
		tc := b == nil || ct.ContentChanged
		switch {
		case !tc || o.SHA256 == t.SHA256:
		case !oc:
			contentFrom = SideTheirs
		default:
			out, n, text, err := m.lines(p, b != nil)
			if err != nil {
				return err
			}
			switch {
			case !text && m.st == Theirs:
				contentFrom = SideTheirs
			case !text && m.st == Ours:
			case !text:
				kinds = append(kinds, ConflictBinary)
				reasons = append(reasons, "both changed the content of a binary file")
			case n > 0:
				kinds = append(kinds, ConflictContent)
				reasons = append(reasons, fmt.Sprintf("%d conflicting region(s)", n))
				merged = out
			default:
				content, contentFrom = out, ""
			}
		}
	case fsdiff.TypeSymlink:
		pick(ConflictSymlink, "both retargeted the symlink", bTarget, o.Target, t.Target, func(bool) { r.Target, contentFrom = t.Target, SideTheirs })
	}
	if o.Type != fsdiff.TypeSymlink {
		pick(ConflictMode, fmt.Sprintf("mode %04o (ours) vs %04o (theirs)", o.Mode, t.Mode), bMode, o.Mode, t.Mode, func(bool) { r.Mode = t.Mode })
	}
	pick(ConflictOwner, fmt.Sprintf("owner %d:%d (ours) vs %d:%d (theirs)", o.UID, o.GID, t.UID, t.GID),
		[2]uint32{bUID, bGID}, [2]uint32{o.UID, o.GID}, [2]uint32{t.UID, t.GID}, func(bool) { r.UID, r.GID = t.UID, t.GID })
	if len(kinds) > 0 {
		return m.conflict(p, kinds[0], strings.Join(reasons, "; "), b, o, t, merged)
	}
	switch {
	case content != nil:
		sum := sha256.Sum256(content)
		r.Size, r.SHA256 = int64(len(content)), hex.EncodeToString(sum[:])
		w.Content = content
	case contentFrom == SideTheirs && o.Type == fsdiff.TypeFile:
		r.Size, r.SHA256 = t.Size, t.SHA256
		w.From = SideTheirs
	case o.Type == fsdiff.TypeFile:
		w.MetaOnly = true
	}
	if same(&r, o) {
		return nil
	}
	w.Node = r
	m.plan.Writes = append(m.plan.Writes, w)
	return nil
}

// lines line-merges the three versions of p; text is false when any of
// them is not text or too large (then it merges as binary).
func (m *merger) lines(p string, haveBase bool) (out []byte, conflicts int, text bool, err error) {
	var b []byte
	if haveBase {
		if b, text, err = m.text(m.in.Base, p); err != nil || !text {
			return nil, 0, false, err
		}
	}
	o, text, err := m.text(m.in.Ours, p)
	if err != nil || !text {
		return nil, 0, false, err
	}
	t, text, err := m.text(m.in.Theirs, p)
	if err != nil || !text {
		return nil, 0, false, err
	}
	fav := map[Strategy]Favor{Ours: FavorOurs, Theirs: FavorTheirs}[m.st]
	out, conflicts = Lines(b, o, t, fav)
	return out, conflicts, true, nil
}

// text reads p from t if it is a text file under the limit.
func (m *merger) text(t *fsdiff.Tree, p string) ([]byte, bool, error) {
	b, err := t.ReadFile(p, m.o.MaxTextBytes)
	switch {
	case errs.Is(err, errs.ResourceExhausted), errs.Is(err, errs.FailedPrecondition), errs.Is(err, errs.NotFound), errs.Is(err, errs.PermissionDenied):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return b, bytes.IndexByte(b, 0) < 0, nil
}

// takeTheirs applies a change only theirs made.
func (m *merger) takeTheirs(p string, c *fsdiff.Change) error {
	o := c.Old // ours is unchanged: it is base
	switch {
	case c.Kind == fsdiff.Deleted || (c.TypeChanged && o.Type == fsdiff.TypeDir):
		if o.Type == fsdiff.TypeDir && m.oursKeepsBelow(p) {
			if c.Kind == fsdiff.Deleted {
				return nil // ours still has entries in it: the directory stays
			}
			return m.conflict(p, ConflictType, "theirs replaced a directory ours changed entries of", o, o, c.New, nil)
		}
		m.plan.Deletes = append(m.plan.Deletes, Delete{Path: p, Expect: o})
		if c.Kind == fsdiff.Deleted {
			return nil
		}
	case c.TypeChanged:
		m.plan.Deletes = append(m.plan.Deletes, Delete{Path: p, Expect: o})
	}
	w := Write{Path: p, Node: *c.New, Expect: o}
	if c.New.Type == fsdiff.TypeFile {
		if c.Kind == fsdiff.Modified && !c.ContentChanged && !c.TypeChanged {
			w.MetaOnly = true
		} else {
			w.From = SideTheirs
		}
	}
	if c.New.Type == fsdiff.TypeDevice {
		return nil // never carried over (fsdiff refused it)
	}
	m.plan.Writes = append(m.plan.Writes, w)
	return nil
}

// parents makes sure every write's parent directory exists in the result:
// ours may have deleted a directory theirs added files to.
func (m *merger) parents() error {
	writing := map[string]bool{}
	for _, w := range m.plan.Writes {
		if w.Node.Type == fsdiff.TypeDir {
			writing[w.Path] = true
		}
	}
	deleting := map[string]bool{}
	for _, d := range m.plan.Deletes {
		deleting[d.Path] = true
	}
	conflicted := map[string]bool{}
	for _, c := range m.plan.Conflicts {
		conflicted[c.Path] = true
	}
	for p := range m.keptOurs {
		conflicted[p] = true
	}
	var extra []Write
writes:
	for _, w := range m.plan.Writes {
		for dir := parentOf(w.Path); dir != "."; dir = parentOf(dir) {
			if conflicted[dir] {
				continue writes // held back with that conflict (finish)
			}
			if writing[dir] {
				continue
			}
			n, ok, err := m.in.Ours.Lookup(dir)
			if err != nil {
				return err
			}
			if ok && n.Type == fsdiff.TypeDir && !deleting[dir] {
				continue
			}
			t, tok, err := m.in.Theirs.Lookup(dir)
			if err != nil {
				return err
			}
			if !tok || t.Type != fsdiff.TypeDir {
				continue // cannot happen for a consistent theirs
			}
			if ok && n.Type != fsdiff.TypeDir {
				if err := m.conflict(dir, ConflictType, "ours replaced a directory theirs added entries to", nil, &n, &t, nil); err != nil {
					return err
				}
				conflicted[dir] = true
				continue writes
			}
			writing[dir] = true
			extra = append(extra, Write{Path: dir, Node: t})
		}
	}
	m.plan.Writes = append(m.plan.Writes, extra...)
	return nil
}

// digestExpects records the content digest of every regular file the plan
// expects in the target, so that Verify notices any edit made after
// planning, even one that keeps the size.
func (m *merger) digestExpects() error {
	fill := func(p string, n **fsdiff.Node) error {
		if *n == nil || (*n).Type != fsdiff.TypeFile || (*n).SHA256 != "" {
			return nil
		}
		h, err := m.in.Ours.Hash(p)
		if err != nil {
			return err
		}
		c := **n
		c.SHA256 = h
		*n = &c
		return nil
	}
	for i := range m.plan.Deletes {
		if err := fill(m.plan.Deletes[i].Path, &m.plan.Deletes[i].Expect); err != nil {
			return err
		}
	}
	for i := range m.plan.Writes {
		if err := fill(m.plan.Writes[i].Path, &m.plan.Writes[i].Expect); err != nil {
			return err
		}
	}
	return nil
}

// finish orders the plan and drops writes under a conflicting path.
func (m *merger) finish() {
	conflicted := map[string]int{}
	for i, c := range m.plan.Conflicts {
		conflicted[c.Path] = i
	}
	under := func(p string) (int, bool) {
		for d := p; d != "."; d = parentOf(d) {
			if i, ok := conflicted[d]; ok {
				return i, true
			}
		}
		return 0, false
	}
	keptAbove := func(p string) bool {
		for d := parentOf(p); d != "."; d = parentOf(d) {
			if m.keptOurs[d] {
				return true
			}
		}
		return false
	}
	ws := m.plan.Writes[:0]
	for _, w := range m.plan.Writes {
		if keptAbove(w.Path) {
			continue // strategy ours kept a non-directory there
		}
		if i, ok := under(w.Path); ok {
			m.plan.Conflicts[i].Below = append(m.plan.Conflicts[i].Below, w)
		} else {
			ws = append(ws, w)
		}
	}
	m.plan.Writes = ws
	sort.SliceStable(m.plan.Writes, func(i, j int) bool { return m.plan.Writes[i].Path < m.plan.Writes[j].Path })
	sort.SliceStable(m.plan.Deletes, func(i, j int) bool { return m.plan.Deletes[i].Path > m.plan.Deletes[j].Path })
	sort.SliceStable(m.plan.Conflicts, func(i, j int) bool { return m.plan.Conflicts[i].Path < m.plan.Conflicts[j].Path })
	if m.plan.Deletes == nil {
		m.plan.Deletes = []Delete{}
	}
	if m.plan.Writes == nil {
		m.plan.Writes = []Write{}
	}
	if m.plan.Conflicts == nil {
		m.plan.Conflicts = []Conflict{}
	}
}

// same says two nodes are the same object (kind, metadata, content).
func same(a, b *fsdiff.Node) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if a.Type != b.Type || a.UID != b.UID || a.GID != b.GID || a.Target != b.Target {
		return false
	}
	if a.Type != fsdiff.TypeSymlink && a.Mode != b.Mode {
		return false
	}
	return a.Type != fsdiff.TypeFile || (a.SHA256 != "" && a.SHA256 == b.SHA256)
}

func parentOf(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "."
	}
	return p[:i]
}

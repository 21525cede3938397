package merge

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/fsdiff"
)

type ent struct {
	name   string
	typ    byte
	body   string
	mode   int64
	uid    int
	target string
}

func file(name, body string) ent { return ent{name: name, body: body, mode: 0o644} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func gone(name string) ent       { return ent{name: name, typ: tar.TypeChar} }
func link(name, to string) ent   { return ent{name: name, typ: tar.TypeSymlink, target: to, mode: 0o777} }
func chmod(e ent, m int64) ent   { e.mode = m; return e }
func chown(e ent, uid int) ent   { e.uid = uid; return e }

func layer(t testing.TB, id string, ents ...ent) *fsdiff.TarLayer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, Typeflag: e.typ, Linkname: e.target}
		if e.typ == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := fsdiff.NewTarLayer(id, &buf, fsdiff.TarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

const text = "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\n"

// inputs builds the three views: a template, the fork snapshot above it,
// and ours/theirs uppers above the snapshot.
func inputs(t testing.TB, ours, theirs []ent) Inputs {
	tmpl := layer(t, "template", dir("etc"), file("etc/conf", text), file("bin.dat", "\x00base"),
		chmod(file("run.sh", "#!/bin/sh\n"), 0o644), dir("d"), file("d/x", "x\n"), file("d/y", "y\n"), link("ln", "etc/conf"))
	snap := layer(t, "snapshot", file("notes", "fork point\n"))
	return Inputs{
		Base:   fsdiff.NewTree(snap, tmpl),
		Ours:   fsdiff.NewTree(layer(t, "ours", ours...), snap, tmpl),
		Theirs: fsdiff.NewTree(layer(t, "theirs", theirs...), snap, tmpl),
	}
}

// step is a plan action as the table compares it.
type step struct {
	Op, Path string
	From     Side
	Content  string
	Mode     uint32
	MetaOnly bool
}

func steps(p *Plan) []step {
	var out []step
	for _, d := range p.Deletes {
		out = append(out, step{Op: "delete", Path: d.Path})
	}
	for _, w := range p.Writes {
		out = append(out, step{Op: "write", Path: w.Path, From: w.From, Content: string(w.Content), Mode: w.Node.Mode, MetaOnly: w.MetaOnly})
	}
	return out
}

type conflictBrief struct {
	Path string
	Kind ConflictKind
}

func conflicts(p *Plan) []conflictBrief {
	var out []conflictBrief
	for _, c := range p.Conflicts {
		out = append(out, conflictBrief{c.Path, c.Kind})
	}
	return out
}

func TestCompute(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ours, theirs []ent
		strategy     Strategy
		want         []step
		conflicts    []conflictBrief
	}{
		{name: "no changes"},
		{
			name:   "theirs writes, edits, deletes and renames",
			theirs: []ent{file("new", "n\n"), dir("etc"), file("etc/conf", "L1\n"+text[3:]), gone("d/x"), file("d/x2", "x\n"), dir("d")},
			want: []step{
				{Op: "delete", Path: "d/x"},
				{Op: "write", Path: "d/x2", From: SideTheirs, Mode: 0o644},
				{Op: "write", Path: "etc/conf", From: SideTheirs, Mode: 0o644},
				{Op: "write", Path: "new", From: SideTheirs, Mode: 0o644},
			},
		},
		{
			name:   "only ours changed: nothing to do",
			ours:   []ent{file("new", "n\n"), gone("d")},
			theirs: nil,
		},
		{
			name:   "different lines merge cleanly",
			ours:   []ent{dir("etc"), file("etc/conf", "OURS\n"+text[3:])},
			theirs: []ent{dir("etc"), file("etc/conf", text[:len(text)-3]+"THEIRS\n")},
			want:   []step{{Op: "write", Path: "etc/conf", Content: "OURS\n" + text[3:len(text)-3] + "THEIRS\n", Mode: 0o644}},
		},
		{
			name:      "same line conflicts",
			ours:      []ent{dir("etc"), file("etc/conf", "l1\nl2\nOURS\n"+text[9:])},
			theirs:    []ent{dir("etc"), file("etc/conf", "l1\nl2\nTHEIRS\n"+text[9:])},
			conflicts: []conflictBrief{{"etc/conf", ConflictContent}},
		},
		{
			name:     "same line, strategy ours keeps ours' line and takes theirs' others",
			ours:     []ent{dir("etc"), file("etc/conf", "l1\nl2\nOURS\n"+text[9:])},
			theirs:   []ent{dir("etc"), file("etc/conf", "l1\nl2\nTHEIRS\n"+text[9:len(text)-3]+"T8\n")},
			strategy: Ours,
			want:     []step{{Op: "write", Path: "etc/conf", Content: "l1\nl2\nOURS\n" + text[9:len(text)-3] + "T8\n", Mode: 0o644}},
		},
		{
			name:     "same line, strategy theirs",
			ours:     []ent{dir("etc"), file("etc/conf", "l1\nl2\nOURS\n"+text[9:])},
			theirs:   []ent{dir("etc"), file("etc/conf", "l1\nl2\nTHEIRS\n"+text[9:])},
			strategy: Theirs,
			want:     []step{{Op: "write", Path: "etc/conf", Content: "l1\nl2\nTHEIRS\n" + text[9:], Mode: 0o644}},
		},
		{
			name:      "binary changed on both sides",
			ours:      []ent{file("bin.dat", "\x00ours")},
			theirs:    []ent{file("bin.dat", "\x00theirs")},
			conflicts: []conflictBrief{{"bin.dat", ConflictBinary}},
		},
		{
			name:   "binary changed on one side",
			ours:   []ent{chmod(file("bin.dat", "\x00base"), 0o600)},
			theirs: []ent{file("bin.dat", "\x00theirs")},
			want:   []step{{Op: "write", Path: "bin.dat", From: SideTheirs, Mode: 0o600}},
		},
		{
			name:     "binary, strategy theirs",
			ours:     []ent{file("bin.dat", "\x00ours")},
			theirs:   []ent{file("bin.dat", "\x00theirs")},
			strategy: Theirs,
			want:     []step{{Op: "write", Path: "bin.dat", From: SideTheirs, Mode: 0o644}},
		},
		{
			name:      "ours deletes, theirs edits",
			ours:      []ent{gone("run.sh")},
			theirs:    []ent{file("run.sh", "#!/bin/sh\necho\n")},
			conflicts: []conflictBrief{{"run.sh", ConflictDelete}},
		},
		{
			name:      "ours edits, theirs deletes",
			ours:      []ent{file("run.sh", "#!/bin/sh\necho\n")},
			theirs:    []ent{gone("run.sh")},
			conflicts: []conflictBrief{{"run.sh", ConflictDelete}},
		},
		{
			name:   "both delete",
			ours:   []ent{gone("run.sh")},
			theirs: []ent{gone("run.sh")},
		},
		{
			name:   "mode change on one side, content on the other",
			ours:   []ent{chmod(file("run.sh", "#!/bin/sh\nours\n"), 0o644)},
			theirs: []ent{chmod(file("run.sh", "#!/bin/sh\n"), 0o755)},
			want:   []step{{Op: "write", Path: "run.sh", Mode: 0o755, MetaOnly: true}},
		},
		{
			name:   "mode change by theirs only",
			theirs: []ent{chmod(file("run.sh", "#!/bin/sh\n"), 0o755)},
			want:   []step{{Op: "write", Path: "run.sh", Mode: 0o755, MetaOnly: true}},
		},
		{
			name:      "different mode changes conflict",
			ours:      []ent{chmod(file("run.sh", "#!/bin/sh\n"), 0o700)},
			theirs:    []ent{chmod(file("run.sh", "#!/bin/sh\n"), 0o755)},
			conflicts: []conflictBrief{{"run.sh", ConflictMode}},
		},
		{
			name:      "different owner changes conflict",
			ours:      []ent{chown(chmod(file("run.sh", "#!/bin/sh\n"), 0o644), 1000)},
			theirs:    []ent{chown(chmod(file("run.sh", "#!/bin/sh\n"), 0o644), 2000)},
			conflicts: []conflictBrief{{"run.sh", ConflictOwner}},
		},
		{
			name:      "symlink retargeted differently",
			ours:      []ent{link("ln", "/a")},
			theirs:    []ent{link("ln", "/b")},
			conflicts: []conflictBrief{{"ln", ConflictSymlink}},
		},
		{
			name:   "symlink retargeted by theirs",
			theirs: []ent{link("ln", "/b")},
			want:   []step{{Op: "write", Path: "ln", Mode: 0o777}},
		},
		{
			name:      "file vs symlink",
			ours:      []ent{link("run.sh", "/bin/true")},
			theirs:    []ent{file("run.sh", "#!/bin/sh\nx\n")},
			conflicts: []conflictBrief{{"run.sh", ConflictType}},
		},
		{
			name:   "add/add identical",
			ours:   []ent{file("same", "s\n")},
			theirs: []ent{file("same", "s\n")},
		},
		{
			name:      "add/add different",
			ours:      []ent{file("same", "ours\n")},
			theirs:    []ent{file("same", "theirs\n")},
			conflicts: []conflictBrief{{"same", ConflictContent}},
		},
		{
			name:   "theirs deletes a directory",
			theirs: []ent{gone("d")},
			want:   []step{{Op: "delete", Path: "d/y"}, {Op: "delete", Path: "d/x"}, {Op: "delete", Path: "d"}},
		},
		{
			name:   "theirs deletes a directory ours added to: the directory stays",
			ours:   []ent{dir("d"), file("d/mine", "m\n")},
			theirs: []ent{gone("d")},
			want:   []step{{Op: "delete", Path: "d/y"}, {Op: "delete", Path: "d/x"}},
		},
		{
			name:   "ours deletes a directory theirs added to: it comes back",
			ours:   []ent{gone("d")},
			theirs: []ent{dir("d"), file("d/new", "n\n")},
			want:   []step{{Op: "write", Path: "d", Mode: 0o755}, {Op: "write", Path: "d/new", From: SideTheirs, Mode: 0o644}},
		},
		{
			name:   "theirs replaces a file with a directory",
			theirs: []ent{dir("run.sh"), file("run.sh/inner", "i\n")},
			want:   []step{{Op: "delete", Path: "run.sh"}, {Op: "write", Path: "run.sh", Mode: 0o755}, {Op: "write", Path: "run.sh/inner", From: SideTheirs, Mode: 0o644}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compute(context.Background(), inputs(t, tc.ours, tc.theirs), Options{Strategy: tc.strategy})
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, steps(p)); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.conflicts, conflicts(p)); d != "" {
				t.Errorf("conflicts (-want +got):\n%s", d)
			}
		})
	}
}

// One conflict on the same line, resolved each way.
func TestResolve(t *testing.T) {
	ours := []ent{dir("etc"), file("etc/conf", "l1\nl2\nOURS\n"+text[9:])}
	theirs := []ent{dir("etc"), file("etc/conf", "l1\nl2\nTHEIRS\n"+text[9:])}
	plan := func() *Plan {
		p, err := Compute(context.Background(), inputs(t, ours, theirs), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Conflicts) != 1 {
			t.Fatalf("conflicts %v, want one", conflicts(p))
		}
		return p
	}
	p := plan()
	c := p.Conflicts[0]
	if string(c.Base.Text) != text || string(c.Ours.Text) != "l1\nl2\nOURS\n"+text[9:] || string(c.Theirs.Text) != "l1\nl2\nTHEIRS\n"+text[9:] {
		t.Fatalf("conflict versions base %q ours %q theirs %q", c.Base.Text, c.Ours.Text, c.Theirs.Text)
	}
	if want := "l1\nl2\n<<<<<<< ours\nOURS\n||||||| base\nl3\n=======\nTHEIRS\n>>>>>>> theirs\n" + text[9:]; string(c.Merged) != want {
		t.Fatalf("merged:\n%s\nwant:\n%s", c.Merged, want)
	}
	if again := plan(); again.Conflicts[0].ID != c.ID {
		t.Fatalf("conflict id %s, then %s for the same inputs", c.ID, again.Conflicts[0].ID)
	}
	// The plan is data: it survives being stored as JSON.
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var stored Plan
	if err := json.Unmarshal(js, &stored); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(p, &stored); d != "" {
		t.Fatalf("JSON round trip (-want +got):\n%s", d)
	}

	mode := uint32(0o600)
	for _, tc := range []struct {
		name string
		r    Resolution
		want []step
	}{
		{"ours", Resolution{Side: SideOurs}, nil},
		{"theirs", Resolution{Side: SideTheirs}, []step{{Op: "write", Path: "etc/conf", Content: "l1\nl2\nTHEIRS\n" + text[9:], Mode: 0o644}}},
		{"base", Resolution{Side: SideBase}, []step{{Op: "write", Path: "etc/conf", Content: text, Mode: 0o644}}},
		{"content", Resolution{Content: []byte("both\n"), Mode: &mode}, []step{{Op: "write", Path: "etc/conf", Content: "both\n", Mode: 0o600}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := plan()
			if err := p.Resolve(p.Conflicts[0].ID, tc.r); err != nil {
				t.Fatal(err)
			}
			if !p.Clean() {
				t.Fatalf("still conflicts: %v", conflicts(p))
			}
			if d := cmp.Diff(tc.want, steps(p)); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
	for _, bad := range []Resolution{{Side: "mine"}, {Side: SideOurs, Content: []byte("x")}} {
		p := plan()
		if err := p.Resolve(p.Conflicts[0].ID, bad); err == nil {
			t.Errorf("resolution %+v accepted", bad)
		}
	}
	if err := plan().Resolve("cnope", Resolution{Side: SideOurs}); err == nil {
		t.Error("unknown conflict id accepted")
	}
}

func TestTouched(t *testing.T) {
	p, err := Compute(context.Background(), inputs(t, nil, []ent{file("new", "n\n"), gone("run.sh")}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"new", "run.sh"}, p.Touched()); d != "" {
		t.Errorf("touched (-want +got):\n%s", d)
	}
	if _, err := ParseStrategy("octopus"); err == nil {
		t.Error("unknown strategy accepted")
	}
}

// Theirs made a directory where ours made a file: one type conflict, and
// resolving it for theirs brings the directory's entries along.
func TestResolveTypeConflictKeepsTheirsBelow(t *testing.T) {
	in := inputs(t, []ent{file("x", "ours\n")}, []ent{dir("x"), file("x/a", "a\n"), dir("x/sub"), file("x/sub/b", "b\n")})
	p, err := Compute(context.Background(), in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]conflictBrief{{"x", ConflictType}}, conflicts(p)); d != "" {
		t.Fatalf("conflicts (-want +got):\n%s", d)
	}
	if len(p.Writes) != 0 {
		t.Fatalf("writes below a conflict were not held back: %v", steps(p))
	}
	for st, want := range map[Strategy][]step{
		Ours: nil,
		Theirs: {
			{Op: "delete", Path: "x"},
			{Op: "write", Path: "x", Mode: 0o755},
			{Op: "write", Path: "x/a", From: SideTheirs, Mode: 0o644},
			{Op: "write", Path: "x/sub", Mode: 0o755},
			{Op: "write", Path: "x/sub/b", From: SideTheirs, Mode: 0o644},
		},
	} {
		sp, err := Compute(context.Background(), in, Options{Strategy: st})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, steps(sp)); d != "" || !sp.Clean() {
			t.Errorf("strategy %s: plan (-want +got):\n%s", st, d)
		}
	}
	if err := p.Resolve(p.Conflicts[0].ID, Resolution{Side: SideTheirs}); err != nil {
		t.Fatal(err)
	}
	want := []step{
		{Op: "delete", Path: "x"},
		{Op: "write", Path: "x", Mode: 0o755},
		{Op: "write", Path: "x/a", From: SideTheirs, Mode: 0o644},
		{Op: "write", Path: "x/sub", Mode: 0o755},
		{Op: "write", Path: "x/sub/b", From: SideTheirs, Mode: 0o644},
	}
	if d := cmp.Diff(want, steps(p)); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
}

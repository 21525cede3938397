package notes

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
)

func TestChanges(t *testing.T) {
	file := func(p string, size int64, sum string, base bool) Entry {
		return Entry{Path: p, Type: "file", Size: size, Sum: sum, Base: base}
	}
	wh := func(p string) Entry { return Entry{Path: p, Type: whiteout, Base: true} }
	man := func(es ...Entry) *Manifest { return &Manifest{Entries: es} }
	for _, tc := range []struct {
		name      string
		prev, cur *Manifest
		want      []FileChange
		counts    [3]int // added, modified, deleted
	}{
		{"first note: against the template", nil,
			man(file("a/new.go", 3, "h1", false), file("etc/hosts", 9, "h2", true), wh("usr/bin/x")),
			[]FileChange{{Path: "a/new.go", Kind: "added", Type: "file", Size: 3}, {Path: "etc/hosts", Kind: "modified", Type: "file", Size: 9},
				{Path: "usr/bin/x", Kind: "deleted"}}, [3]int{1, 1, 1}},
		{"nothing changed", man(file("a", 1, "h", false)), man(file("a", 1, "h", false)), nil, [3]int{}},
		{"same size, new content", man(file("a", 1, "h", false)), man(file("a", 1, "g", false)),
			[]FileChange{{Path: "a", Kind: "modified", Type: "file", Size: 1, OldSize: 1}}, [3]int{0, 1, 0}},
		{"unhashed, same size: unchanged", man(file("a", 5, "", false)), man(file("a", 5, "h", false)), nil, [3]int{}},
		{"grown", man(file("a", 1, "", false)), man(file("a", 7, "", false)),
			[]FileChange{{Path: "a", Kind: "modified", Type: "file", Size: 7, OldSize: 1}}, [3]int{0, 1, 0}},
		{"removed again (created since the template)", man(file("tmp/x", 4, "h", false)), man(),
			[]FileChange{{Path: "tmp/x", Kind: "deleted", Type: "file", OldSize: 4}}, [3]int{0, 0, 1}},
		{"template file deleted since", man(file("etc/motd", 4, "h", true)), man(wh("etc/motd")),
			[]FileChange{{Path: "etc/motd", Kind: "deleted", Type: "file", OldSize: 4}}, [3]int{0, 0, 1}},
		{"deleted file back", man(wh("etc/motd")), man(file("etc/motd", 2, "h", true)),
			[]FileChange{{Path: "etc/motd", Kind: "added", Type: "file", Size: 2}}, [3]int{1, 0, 0}},
		{"a whiteout stays a whiteout", man(wh("x")), man(wh("x")), nil, [3]int{}},
		{"back to the template's after a restore", man(file("etc/hosts", 9, "h2", true)), man(),
			[]FileChange{{Path: "etc/hosts", Kind: "modified", OldSize: 9}}, [3]int{0, 1, 0}},
		{"file became a symlink", man(file("l", 3, "h", false)), man(Entry{Path: "l", Type: "symlink", Target: "/etc"}),
			[]FileChange{{Path: "l", Kind: "modified", Type: "symlink", OldSize: 3}}, [3]int{0, 1, 0}},
		{"symlink retargeted", man(Entry{Path: "l", Type: "symlink", Target: "a"}), man(Entry{Path: "l", Type: "symlink", Target: "b"}),
			[]FileChange{{Path: "l", Kind: "modified", Type: "symlink"}}, [3]int{0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Changes(tc.prev, tc.cur, 0)
			if d := cmp.Diff(tc.want, got.Changes); d != "" {
				t.Errorf("changes (-want +got):\n%s", d)
			}
			if c := [3]int{got.Added, got.Modified, got.Deleted}; c != tc.counts || got.Total != c[0]+c[1]+c[2] {
				t.Errorf("counts = %v total %d, want %v", c, got.Total, tc.counts)
			}
		})
	}
}

func TestChangesLimit(t *testing.T) {
	var es []Entry
	for i := range 500 {
		es = append(es, Entry{Path: strings.Repeat("d/", 2) + string(rune('a'+i%26)) + time.Duration(i).String(), Type: "file", Size: int64(i)})
	}
	got := Changes(nil, &Manifest{Entries: es, Truncated: true}, MaxFiles)
	if len(got.Changes) != MaxFiles || got.Total != 500 || got.Added != 500 || !got.Truncated {
		t.Fatalf("listed %d total %d added %d truncated %v; want %d of 500, truncated", len(got.Changes), got.Total, got.Added, got.Truncated, MaxFiles)
	}
}

func TestCurrentDesync(t *testing.T) {
	n := func(seq int64, cv string, collected bool) Note {
		return Note{Seq: seq, Supplied: Supplied{ContextVersion: cv}, Collected: collected}
	}
	stored := &Desync{AgentVersion: "v9", MachineVersion: "v3"}
	for _, tc := range []struct {
		name  string
		notes []Note // newest first
		want  *Desync
	}{
		{"none", nil, nil},
		{"newest describes the machine", []Note{n(2, "v2", true), n(1, "v1", true)}, nil},
		{"declared while paused, newer than the pause note", []Note{n(3, "v5", false), n(2, "v4", true)}, &Desync{AgentVersion: "v5", MachineVersion: "v4"}},
		{"declared the same version", []Note{n(3, "v4", false), n(2, "v4", true)}, nil},
		{"no version declared", []Note{n(3, "", false), n(2, "", true)}, nil},
		{"no machine note at all", []Note{n(1, "v1", false)}, nil},
		{"restore note's stored desync", []Note{{Seq: 4, Restored: &Ref{Seq: 1}, Desync: stored}, n(3, "v9", true)}, stored},
		{"inherited note describes the machine", []Note{n(2, "v7", false), {Seq: 1, Inherited: &Ref{}, Supplied: Supplied{ContextVersion: "v6"}}},
			&Desync{AgentVersion: "v7", MachineVersion: "v6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CurrentDesync(tc.notes)
			if got != nil {
				got = &Desync{AgentVersion: got.AgentVersion, MachineVersion: got.MachineVersion}
			}
			if tc.want != nil {
				tc.want = &Desync{AgentVersion: tc.want.AgentVersion, MachineVersion: tc.want.MachineVersion}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("desync (-want +got):\n%s", d)
			}
		})
	}
}

func TestRestoreDesync(t *testing.T) {
	point := &Note{Sandbox: "a", Seq: 2, Supplied: Supplied{ContextVersion: "v2"}}
	for _, tc := range []struct {
		name          string
		point, latest *Note
		want          *Desync
	}{
		{"agent moved on", point, &Note{Sandbox: "a", Seq: 5, Supplied: Supplied{ContextVersion: "v5"}}, &Desync{AgentVersion: "v5", MachineVersion: "v2"}},
		{"restored to the newest note", point, point, nil},
		{"no version declared", point, &Note{Sandbox: "a", Seq: 5}, nil},
		{"same version", point, &Note{Sandbox: "a", Seq: 5, Supplied: Supplied{ContextVersion: "v2"}}, nil},
		{"no note at the point", nil, &Note{Sandbox: "a", Seq: 5, Supplied: Supplied{ContextVersion: "v5"}}, &Desync{AgentVersion: "v5"}},
		{"no notes at all", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RestoreDesync(tc.point, tc.latest)
			if (got == nil) != (tc.want == nil) || got != nil && (got.AgentVersion != tc.want.AgentVersion || got.MachineVersion != tc.want.MachineVersion || got.Message == "") {
				t.Errorf("RestoreDesync = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseGitHostile(t *testing.T) {
	var b strings.Builder
	b.WriteString("\036R\n\036B\nmain\n\036H\nabc1234\n\036S\n M a.go\n?? new.txt\n\036N 2\n\036U\nabc1234 add a\n\036N 1\n")
	// A second repository that answers garbage: a huge line, control
	// characters, a forged count, many lines.
	b.WriteString("\036R\n\036B\n" + strings.Repeat("x", 10000) + "\x1b[31m\n\036S\n")
	for i := range 1000 {
		b.WriteString(" M f" + time.Duration(i).String() + "\n")
	}
	b.WriteString("\036N 99999999999999999999\n")
	for range 100 {
		b.WriteString("\036R\n")
	}
	got := parseGit([]byte(b.String()))
	if len(got) != MaxRepos {
		t.Fatalf("%d repositories parsed, want the cap %d", len(got), MaxRepos)
	}
	want0 := Repo{Branch: "main", Head: "abc1234", Dirty: []string{" M a.go", "?? new.txt"}, DirtyTotal: 2, Unpushed: []string{"abc1234 add a"}, UnpushedTotal: 1}
	if d := cmp.Diff(want0, got[0]); d != "" {
		t.Errorf("first repository (-want +got):\n%s", d)
	}
	r := got[1]
	if len(r.Branch) > MaxLine || strings.ContainsRune(r.Branch, 0x1b) || len(r.Dirty) != MaxRepoLines || r.DirtyTotal > 1<<30 {
		t.Errorf("hostile repository not bounded: branch %d bytes, %d dirty lines, total %d", len(r.Branch), len(r.Dirty), r.DirtyTotal)
	}
}

func TestSuppliedValidate(t *testing.T) {
	if err := (Supplied{Reason: "done", ContextVersion: "v1"}).Validate(); err != nil {
		t.Fatal(err)
	}
	for field, s := range map[string]Supplied{
		"reason":          {Reason: strings.Repeat("a", MaxField+1)},
		"unfinished":      {Unfinished: "\xff\xfe"},
		"next":            {Next: strings.Repeat("a", MaxField+1)},
		"context_version": {ContextVersion: "a\nb"},
	} {
		err := s.Validate()
		if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != field {
			t.Errorf("%s: Validate = %v (field %q), want InvalidArgument naming it", field, err, errs.FieldOf(err))
		}
	}
}

package lineage

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSortChildren(t *testing.T) {
	pass := &CheckResult{}
	fail := &CheckResult{ExitCode: 1}
	timeout := &CheckResult{ExitCode: -1, Signal: "killed", TimedOut: true}
	broken := &CheckResult{Error: "exec failed"}
	st := func(files, lines int) *fsdiff.Stat { return &fsdiff.Stat{Files: files, LinesAdded: lines} }
	for _, tc := range []struct {
		name string
		in   []ChildReport
		want []string
	}{
		{"passing first, then smaller diffs", []ChildReport{
			{ID: "a", Check: fail, Stat: st(1, 1)},
			{ID: "b", Check: pass, Stat: st(9, 90)},
			{ID: "c", Check: pass, Stat: st(1, 2)},
			{ID: "d", Check: timeout, Stat: st(0, 0)},
		}, []string{"c", "b", "d", "a"}},
		{"no check: by diff size, a missing stat last", []ChildReport{
			{ID: "x", Stat: nil},
			{ID: "y", Stat: st(3, 0)},
			{ID: "z", Stat: st(1, 0)},
		}, []string{"z", "y", "x"}},
		{"a broken check is not passing; ties by id", []ChildReport{
			{ID: "q", Check: broken, Stat: st(1, 0)},
			{ID: "p", Check: fail, Stat: st(1, 0)},
			{ID: "r", Check: pass, Stat: st(5, 0)},
		}, []string{"r", "p", "q"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			SortChildren(tc.in)
			var got []string
			for _, c := range tc.in {
				got = append(got, c.ID)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestTail(t *testing.T) {
	tl := &tail{n: 5}
	for _, s := range []string{"ab", "cdef", "", "ghij"} {
		_, _ = tl.Write([]byte(s))
	}
	if got := string(tl.buf); got != "fghij" {
		t.Fatalf("tail = %q, want fghij", got)
	}
	_, _ = tl.Write([]byte(strings.Repeat("z", 100)))
	if len(tl.buf) != 5 {
		t.Fatalf("tail kept %d bytes", len(tl.buf))
	}
}

func TestCheckCompare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   CompareRequest
		field string
		want  time.Duration
	}{
		{"default timeout", CompareRequest{Check: "true"}, "", DefaultCheckTimeout},
		{"explicit timeout", CompareRequest{Check: "true", Timeout: time.Minute}, "", time.Minute},
		{"negative timeout", CompareRequest{Timeout: -time.Second}, "timeout", 0},
		{"too long", CompareRequest{Timeout: 3 * time.Hour}, "timeout", 0},
		{"huge check", CompareRequest{Check: strings.Repeat("x", MaxCheckBytes+1)}, "check", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCompare(&tc.req)
			if tc.field != "" {
				if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != tc.field {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.field)
				}
				return
			}
			if err != nil || tc.req.Timeout != tc.want {
				t.Fatalf("err %v, timeout %s", err, tc.req.Timeout)
			}
		})
	}
}

// storeCore is dirCore with a real SQLite store (compare lists children).
type storeCore struct {
	*dirCore
	st store.Store
}

func (c storeCore) Store() store.Store { return c.st }

// TestCompareChildren: the children of one owner's parent (not other
// owners', not the parent's siblings) are compared in parallel; with no
// agent the check reports an error, the stat is still there; another
// owner's compare is NotFound.
func TestCompareChildren(t *testing.T) {
	dir := t.TempDir()
	tpl, snap := digestOf('a'), digestOf('b')
	writeFiles(t, filepath.Join(dir, "layers", tpl), map[string]string{"f": "1\n"})
	writeFiles(t, filepath.Join(dir, "layers", snap), map[string]string{"g": "1\n"})
	st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	dc := &dirCore{dir: dir, sbs: map[string]*sandbox.Sandbox{}}
	add := func(id, owner, parent string, files map[string]string) {
		sb := &sandbox.Sandbox{ID: id, Owner: owner, Template: "tiny", Runtime: "runc", State: sandbox.Running,
			Attrs: sandbox.Attrs{Layers: []string{snap, tpl}, Lineage: sandbox.Lineage{Parent: parent}}}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		dc.sbs[id] = sb
		writeFiles(t, filepath.Join(dir, "sandboxes", id, "upper"), files)
	}
	add("parent", "alice", "", map[string]string{"p": "p\n"})
	add("big", "alice", "parent", map[string]string{"a": "1\n2\n3\n", "b": "x\n"})
	add("small", "alice", "parent", map[string]string{"a": "1\n"})
	add("other", "alice", "elsewhere", map[string]string{"a": "1\n"})
	add("bobs", "bob", "parent", map[string]string{"a": "1\n"})
	s := New(storeCore{dc, st}, Config{DataDir: dir})
	got, err := s.Compare(ctx, CompareRequest{Owner: "alice", ID: "parent", Check: "true"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range got {
		ids = append(ids, c.ID)
		if c.Stat == nil || c.Check == nil || c.Check.Error == "" || c.Cost == nil {
			t.Errorf("%s: %+v", c.ID, c)
		}
	}
	if d := cmp.Diff([]string{"small", "big"}, ids); d != "" {
		t.Fatal(d)
	}
	if got[1].Stat.Files != 2 || got[1].Stat.LinesAdded != 4 {
		t.Errorf("big's stat %+v", got[1].Stat)
	}
	if _, err := s.Compare(ctx, CompareRequest{Owner: "bob", ID: "parent"}); !errs.Is(err, errs.NotFound) {
		t.Fatalf("bob compares alice's parent: %v", err)
	}
}

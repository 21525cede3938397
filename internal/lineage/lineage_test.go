package lineage

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestParseAgainst(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want against
		kind errs.Kind
	}{
		{"", against{kind: "base"}, 0},
		{"abc123", against{kind: "sandbox", id: "abc123"}, 0},
		{"checkpoint:c1", against{kind: "checkpoint", checkpoint: "c1"}, 0},
		{"checkpoint:", against{}, errs.InvalidArgument},
		{"checkpoint:../x", against{}, errs.InvalidArgument},
		{"Bad-ID", against{}, errs.InvalidArgument},
		{"../etc", against{}, errs.InvalidArgument},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseAgainst(tc.in)
			if tc.kind != 0 {
				if !errs.Is(err, tc.kind) || errs.FieldOf(err) != "against" {
					t.Fatalf("err = %v (field %q), want %v naming against", err, errs.FieldOf(err), tc.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(against{})); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestCommonBase(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []string
		want int
	}{
		{"same template", []string{"t"}, []string{"t"}, 1},
		{"two forks of one snapshot", []string{"s", "t"}, []string{"s", "t"}, 2},
		{"fork against template", []string{"s", "t2", "t1"}, []string{"t2", "t1"}, 2},
		{"unrelated", []string{"a"}, []string{"b"}, 0},
		{"same top, other bottom", []string{"s", "a"}, []string{"s", "b"}, 0},
		{"empty", nil, []string{"t"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commonBase(tc.a, tc.b); got != tc.want {
				t.Fatalf("commonBase = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestBound(t *testing.T) {
	res := &fsdiff.Result{Changes: []fsdiff.Change{
		{Path: "a", Unified: strings.Repeat("x", 40)},
		{Path: "b"},
		{Path: "c", Unified: strings.Repeat("y", 70)},
		{Path: "d", Unified: strings.Repeat("z", 50), LinesAdded: 3},
	}}
	Bound(res, 100)
	var got []string
	for _, c := range res.Changes {
		got = append(got, c.Path+":"+c.TextOmitted+":"+string(rune('0'+len(c.Unified)/10)))
	}
	want := []string{"a::4", "b::0", "c:" + OmittedTooLarge + ":0", "d::5"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatal(d)
	}
	if res.Changes[3].LinesAdded != 3 {
		t.Fatal("counts must be kept")
	}
}

func TestCheckOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		o     fsdiff.Options
		kind  errs.Kind
		field string
	}{
		{"defaults", fsdiff.Options{}, 0, ""},
		{"max text too big", fsdiff.Options{MaxTextBytes: MaxTextBytesLimit + 1}, errs.InvalidArgument, "max_text"},
		{"negative max text", fsdiff.Options{MaxTextBytes: -1}, errs.InvalidArgument, "max_text"},
		{"empty path", fsdiff.Options{Paths: []string{""}}, errs.InvalidArgument, "path"},
		{"too many paths", fsdiff.Options{Paths: make([]string, 1001)}, errs.ResourceExhausted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkOptions(&tc.o)
			if tc.kind == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errs.Is(err, tc.kind) || errs.FieldOf(err) != tc.field {
				t.Fatalf("err = %v, want %v field %q", err, tc.kind, tc.field)
			}
		})
	}
}

// dirCore is a Core over plain directories: layers under dir/layers,
// uppers under dir/sandboxes/<id>/upper.
type dirCore struct {
	dir string
	sbs map[string]*sandbox.Sandbox

	mu      sync.Mutex
	locked  map[string]int // lock holders per sandbox
	mounted int            // read-only workspace mounts alive
}

func (c *dirCore) Visible(_ context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, ok := c.sbs[id]
	if !ok || owner != "" && sb.Owner != owner {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}
func (c *dirCore) RuntimeFor(*sandbox.Sandbox) (runtime.Runtime, error) { return nil, nil }
func (c *dirCore) UpperDir(sb *sandbox.Sandbox) (string, error) {
	return filepath.Join(c.dir, "sandboxes", sb.ID, "upper"), nil
}
func (c *dirCore) UserNS(*sandbox.Sandbox) *rootfs.IDMap { return nil }
func (c *dirCore) Lock(id string) func() {
	c.mu.Lock()
	if c.locked == nil {
		c.locked = map[string]int{}
	}
	c.locked[id]++
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.locked[id]--
		c.mu.Unlock()
	}
}
func (c *dirCore) MountWorkspace(_ context.Context, sb *sandbox.Sandbox) (string, func() error, error) {
	c.mu.Lock()
	held := c.locked[sb.ID] > 0
	c.mounted++
	c.mu.Unlock()
	if !held {
		return "", nil, errs.E(errs.Internal, "mount of %s without its lock", sb.ID)
	}
	return filepath.Join(c.dir, "sandboxes", sb.ID, "upper"), func() error {
		c.mu.Lock()
		c.mounted--
		c.mu.Unlock()
		return nil
	}, nil
}
func (c *dirCore) LayerPath(dg string) string { return filepath.Join(c.dir, "layers", dg) }
func (c *dirCore) Store() store.Store         { return nil }
func (c *dirCore) Agent(context.Context, string, string) (*agentapi.Client, error) {
	return nil, errs.E(errs.Unavailable, "no agents here")
}
func (c *dirCore) Usage(context.Context, string) (Cost, error) { return Cost{}, nil }

func digestOf(c byte) string { return strings.Repeat(string(c), 64) }

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type stackResolver map[string][]string

func (r stackResolver) CheckpointLayers(_ context.Context, sb, c string) ([]string, error) {
	l, ok := r[sb+"/"+c]
	if !ok {
		return nil, errs.E(errs.NotFound, "checkpoint %q not found", c)
	}
	return l, nil
}

func TestDiffViews(t *testing.T) {
	dir := t.TempDir()
	tpl, snap, other, ck := digestOf('a'), digestOf('b'), digestOf('c'), digestOf('d')
	writeFiles(t, filepath.Join(dir, "layers", tpl), map[string]string{"etc/os": "tiny\n", "src/main.go": "package main\n"})
	writeFiles(t, filepath.Join(dir, "layers", snap), map[string]string{"src/main.go": "package main\n\nfunc main() {}\n"})
	writeFiles(t, filepath.Join(dir, "layers", other), map[string]string{"x": "x\n"})
	writeFiles(t, filepath.Join(dir, "layers", ck), map[string]string{"ck": "1\n"})
	writeFiles(t, filepath.Join(dir, "sandboxes", "child1", "upper"), map[string]string{"new.txt": "hello\n"})
	writeFiles(t, filepath.Join(dir, "sandboxes", "child2", "upper"), map[string]string{"src/main.go": "package other\n"})
	writeFiles(t, filepath.Join(dir, "sandboxes", "plain", "upper"), map[string]string{"p": "p\n"})
	writeFiles(t, filepath.Join(dir, "sandboxes", "gone", "upper"), map[string]string{"stopped.txt": "s\n"})
	if err := os.MkdirAll(filepath.Join(dir, "sandboxes", "alien", "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := sandbox.Running
	core := &dirCore{dir: dir, sbs: map[string]*sandbox.Sandbox{
		"child1": {ID: "child1", Owner: "alice", State: run, Attrs: sandbox.Attrs{Layers: []string{snap, tpl}, Lineage: sandbox.Lineage{Parent: "p", Snapshot: "s1"}}},
		"child2": {ID: "child2", Owner: "alice", State: run, Attrs: sandbox.Attrs{Layers: []string{snap, tpl}, Lineage: sandbox.Lineage{Parent: "p", Snapshot: "s1"}}},
		"plain":  {ID: "plain", Owner: "alice", State: run, Attrs: sandbox.Attrs{Layers: []string{tpl}}},
		"alien":  {ID: "alien", Owner: "alice", State: run, Attrs: sandbox.Attrs{Layers: []string{other}}},
		"bobs":   {ID: "bobs", Owner: "bob", State: run, Attrs: sandbox.Attrs{Layers: []string{tpl}}},
		"gone":   {ID: "gone", Owner: "alice", State: sandbox.Stopped, Attrs: sandbox.Attrs{Layers: []string{tpl}}},
		"broken": {ID: "broken", Owner: "alice", State: sandbox.Failed, Attrs: sandbox.Attrs{Layers: []string{tpl}}},
	}}
	s := New(core, Config{DataDir: dir})
	ctx := context.Background()
	paths := func(r *fsdiff.Result) []string {
		var out []string
		for _, c := range r.Changes {
			out = append(out, string(c.Kind)+" "+c.Path)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		req     DiffRequest
		want    []string
		kind    errs.Kind
		resolve CheckpointResolver
	}{
		{name: "fork against its fork point", req: DiffRequest{Owner: "alice", ID: "child1"}, want: []string{"added new.txt"}},
		{name: "not forked: against the template", req: DiffRequest{Owner: "alice", ID: "plain"}, want: []string{"added p"}},
		{name: "two forks", req: DiffRequest{Owner: "alice", ID: "child1", Against: "child2"}, want: []string{"deleted new.txt", "modified src/main.go"}},
		{name: "fork against a plain sandbox of its template", req: DiffRequest{Owner: "alice", ID: "plain", Against: "child1"},
			want: []string{"added new.txt", "deleted p", "modified src/main.go"}},
		{name: "path filter", req: DiffRequest{Owner: "alice", ID: "child1", Against: "child2", Options: fsdiff.Options{Paths: []string{"src"}}}, want: []string{"modified src/main.go"}},
		{name: "unrelated", req: DiffRequest{Owner: "alice", ID: "child1", Against: "alien"}, kind: errs.FailedPrecondition},
		{name: "another owner's sandbox", req: DiffRequest{Owner: "bob", ID: "child1"}, kind: errs.NotFound},
		{name: "against another owner's sandbox", req: DiffRequest{Owner: "alice", ID: "child1", Against: "bobs"}, kind: errs.NotFound},
		{name: "stopped: its workspace read under its lock", req: DiffRequest{Owner: "alice", ID: "gone"}, want: []string{"added stopped.txt"}},
		{name: "stopped against running", req: DiffRequest{Owner: "alice", ID: "plain", Against: "gone"}, want: []string{"deleted p", "added stopped.txt"}},
		{name: "running against stopped", req: DiffRequest{Owner: "alice", ID: "gone", Against: "plain"}, want: []string{"added p", "deleted stopped.txt"}},
		{name: "failed", req: DiffRequest{Owner: "alice", ID: "broken"}, kind: errs.FailedPrecondition},
		{name: "checkpoint without a timeline", req: DiffRequest{Owner: "alice", ID: "child1", Against: "checkpoint:c1"}, kind: errs.NotFound},
		{name: "checkpoint", req: DiffRequest{Owner: "alice", ID: "child1", Against: "checkpoint:c1"},
			resolve: stackResolver{"child1/c1": {ck, snap, tpl}}, want: []string{"deleted ck", "added new.txt"}},
		{name: "unknown checkpoint", req: DiffRequest{Owner: "alice", ID: "child1", Against: "checkpoint:c9"},
			resolve: stackResolver{}, kind: errs.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.SetCheckpoints(tc.resolve)
			res, err := s.Diff(ctx, tc.req)
			if tc.kind != 0 {
				if !errs.Is(err, tc.kind) {
					t.Fatalf("err = %v, want %v", err, tc.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, paths(res)); d != "" {
				t.Fatal(d)
			}
			core.mu.Lock()
			defer core.mu.Unlock()
			for id, n := range core.locked {
				if n != 0 {
					t.Errorf("sandbox %s still locked %d times", id, n)
				}
			}
			if core.mounted != 0 {
				t.Errorf("%d read-only mounts left", core.mounted)
			}
		})
	}
}

func TestViewClose(t *testing.T) {
	dir := t.TempDir()
	tpl := digestOf('a')
	writeFiles(t, filepath.Join(dir, "layers", tpl), map[string]string{"f": "1\n"})
	s := New(&dirCore{dir: dir}, Config{DataDir: dir})
	v, err := s.LayersView([]string{tpl})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok, err := v.Tree.Lookup("f"); err != nil || !ok || n.Type != fsdiff.TypeFile {
		t.Fatalf("lookup f = %+v %v %v", n, ok, err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	if _, err := s.LayersView([]string{"../../etc"}); !errs.Is(err, errs.FailedPrecondition) && !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("bad digest: %v", err)
	}
	if _, err := s.LayersView([]string{digestOf('f')}); err == nil {
		t.Fatal("missing layer gave a view")
	}
}

func TestReadBudget(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"big": strings.Repeat("x", 100)})
	l, err := fsdiff.OpenDirLayer(dir, "d", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	b := newBudget(150)
	bl := boundedLayer{Layer: l, b: b, ctx: ctx}
	read := func() error {
		rc, err := bl.Open("big")
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.ReadAll(rc)
		return err
	}
	if err := read(); err != nil {
		t.Fatalf("first read within the budget: %v", err)
	}
	if err := read(); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("second read past the budget: %v, want ResourceExhausted", err)
	}
	cancel()
	b.left.Store(1 << 20)
	if err := read(); err == nil {
		t.Fatal("read after the request ended succeeded")
	}
	// A sparse file of 1 TiB is refused before a byte is read.
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	f.Close()
	bl.ctx = context.Background()
	if _, err := bl.Open("sparse"); !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("open of a 1 TiB sparse file: %v, want ResourceExhausted", err)
	}
}

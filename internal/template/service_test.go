package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// tcore is a small template.Core over a real SQLite store. Build
// sandboxes are records only: their agent is unreachable, so a RUN step
// fails the way it does when a sandbox's agent does not answer.
type tcore struct {
	t  *testing.T
	st store.Store

	mu       sync.Mutex
	bootErr  error
	started  []string
	removed  []string
	users    map[string][]string
	pools    map[string]bool
	pinned   map[string]bool
	bgDone   chan struct{}
	openStrm int
}

func newTCore(t *testing.T) *tcore {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &tcore{t: t, st: st, users: map[string][]string{}, pools: map[string]bool{}, pinned: map[string]bool{}}
}

func (c *tcore) Store() store.Store    { return c.st }
func (c *tcore) Log() *slog.Logger     { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func (c *tcore) Lock(id string) func() { return func() {} }
func (c *tcore) GoBackground(name string, fn func(ctx context.Context)) {
	fn(c.t.Context())
}
func (c *tcore) AgentClient(id string) *agentapi.Client {
	return agentapi.UnreachableClient(errors.New("no agent in a unit test"))
}
func (c *tcore) OpenStream(id string) func() {
	c.mu.Lock()
	c.openStrm++
	c.mu.Unlock()
	return func() { c.mu.Lock(); c.openStrm--; c.mu.Unlock() }
}

func (c *tcore) StartBuildSandbox(ctx context.Context, layers []string, network string, note func(string)) (*sandbox.Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bootErr != nil {
		return nil, c.bootErr
	}
	sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: BuildOwner, State: sandbox.Running}
	c.started = append(c.started, sb.ID)
	note("starting build sandbox " + sb.ID)
	return sb, nil
}

func (c *tcore) RemoveBuildSandbox(ctx context.Context, id string) error {
	c.mu.Lock()
	c.removed = append(c.removed, id)
	c.mu.Unlock()
	return nil
}

func (c *tcore) CaptureWorkspace(ctx context.Context, sb *sandbox.Sandbox) (Layer, error) {
	return Layer{}, errs.E(errs.Internal, "no workspace in a unit test")
}

func (c *tcore) TemplateUsers(ctx context.Context, name string) ([]string, error) {
	return c.users[name], nil
}
func (c *tcore) HasPool(ctx context.Context, name string) (bool, error) { return c.pools[name], nil }
func (c *tcore) PinnedLayers(ctx context.Context) (map[string]bool, error) {
	return c.pinned, nil
}

func newTestService(t *testing.T) (*Service, *tcore) {
	c := newTCore(t)
	return NewService(ServiceConfig{DefaultTemplate: "default"}, openStore(t), c), c
}

func TestServiceValidName(t *testing.T) {
	for name, ok := range map[string]bool{
		"default": true, "tiny": true, "py3.12_slim-x": true, "0abc": true, strings.Repeat("a", 63): true,
		"": false, "Default": false, "-x": false, ".x": false, "a/b": false, "a b": false, strings.Repeat("a", 64): false,
	} {
		err := ValidName(name)
		if (err == nil) != ok {
			t.Errorf("ValidName(%q) = %v, want ok %v", name, err, ok)
		}
		if err != nil && !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("ValidName(%q): kind %v, want InvalidArgument", name, errs.KindOf(err))
		}
	}
}

func TestServiceFingerprintOf(t *testing.T) {
	base := store.Template{Name: "a", Layers: []string{"l2", "l1"}, StartCmd: []string{"sh", "-c", "x"}, Workdir: "/w", User: "u"}
	fp := FingerprintOf(base)
	if len(fp) != 32 {
		t.Fatalf("fingerprint %q: want 32 hex chars", fp)
	}
	same := base
	same.Name, same.Source, same.State, same.Env = "b", "other", store.TemplateFailed, map[string]string{"K": "V"}
	if FingerprintOf(same) != fp {
		t.Error("name, source, state or env changed the fingerprint")
	}
	for name, edit := range map[string]func(*store.Template){
		"layer order": func(t *store.Template) { t.Layers = []string{"l1", "l2"} },
		"layers":      func(t *store.Template) { t.Layers = []string{"l2"} },
		"start cmd":   func(t *store.Template) { t.StartCmd = []string{"sh", "-c x"} },
		"workdir":     func(t *store.Template) { t.Workdir = "/" },
		"user":        func(t *store.Template) { t.User = "root" },
	} {
		d := base
		edit(&d)
		if FingerprintOf(d) == fp {
			t.Errorf("%s not part of the fingerprint", name)
		}
	}
}

func tinyTar(t *testing.T) []byte {
	return mkTar(t, dir("bin/", 0o755), file("bin/sh", "#!/bin/true\n"), dir("etc/", 0o755), file("etc/os-release", "ID=unit\n"))
}

func TestServiceImport(t *testing.T) {
	s, _ := newTestService(t)
	ctx := t.Context()
	tp, err := s.Import(ctx, "base", bytes.NewReader(tinyTar(t)), "upload")
	if err != nil {
		t.Fatal(err)
	}
	if tp.State != store.TemplateReady || len(tp.Layers) != 1 || tp.Fingerprint != FingerprintOf(tp) || tp.Source != "upload" {
		t.Fatalf("imported template = %+v", tp)
	}
	if !s.layers.HasLayer(tp.Layers[0]) {
		t.Fatal("layer not stored")
	}
	// Garbage fails and says so in the record.
	if _, err := s.Import(ctx, "bad", strings.NewReader("not a tarball"), "upload"); err == nil {
		t.Fatal("garbage imported")
	}
	rec, err := s.store().GetTemplate(ctx, "bad")
	if err != nil || rec.State != store.TemplateFailed || rec.Error == "" {
		t.Errorf("record of a failed import = %+v, %v", rec, err)
	}
	if _, err := s.Import(ctx, "Bad Name", bytes.NewReader(tinyTar(t)), ""); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("bad name: %v, want InvalidArgument", err)
	}
}

func TestServiceRemoveAndCollect(t *testing.T) {
	s, c := newTestService(t)
	ctx := t.Context()
	mk := func(name, body string) store.Template {
		t.Helper()
		tp, err := s.Import(ctx, name, bytes.NewReader(mkTar(t, file("f", body))), "")
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	a, b := mk("a", "a"), mk("b", "b")
	pinned, snap, mounted, loose := mk("p", "p"), mk("s", "s"), mk("m", "m"), mk("x", "x")
	for _, n := range []string{"p", "s", "m", "x"} {
		if err := s.store().DeleteTemplate(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	c.pinned[pinned.Layers[0]] = true
	if err := s.store().CreateSnapshot(ctx, store.Snapshot{ID: "sn1", Owner: "o", Template: "a", Layers: snap.Layers}); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Remove(ctx, "nope"); !errs.Is(err, errs.NotFound) {
		t.Errorf("Remove of a missing template: %v, want NotFound", err)
	}
	c.users["a"] = []string{"sb1", "sb2"}
	if _, err := s.Remove(ctx, "a"); !errs.Is(err, errs.Conflict) || !strings.Contains(err.Error(), "sb1, sb2") {
		t.Errorf("Remove of a used template: %v, want Conflict naming sb1, sb2", err)
	}
	delete(c.users, "a")
	c.pools["a"] = true
	if _, err := s.Remove(ctx, "a"); !errs.Is(err, errs.Conflict) || !strings.Contains(err.Error(), "pool") {
		t.Errorf("Remove of a pooled template: %v, want Conflict about its pool", err)
	}
	delete(c.pools, "a")
	if _, err := s.store().GetTemplate(ctx, "a"); err != nil {
		t.Fatalf("a refused Remove deleted the record: %v", err)
	}

	// The real GC reads /proc/self/mountinfo; the mounted case goes
	// through collect with a mount table naming m's layer.
	w := s.work()
	w.gc.Lock()
	used := map[string]bool{b.Layers[0]: true, pinned.Layers[0]: true, snap.Layers[0]: true, a.Layers[0]: true}
	n, err := s.collect(used, "123 1 0:1 / /x rw - overlay overlay rw,lowerdir="+s.layers.LayerPath(mounted.Layers[0])+"\n")
	w.gc.Unlock()
	if err != nil || n != 1 {
		t.Fatalf("collect = %d, %v; want 1 (the loose layer)", n, err)
	}
	if s.layers.HasLayer(loose.Layers[0]) || !s.layers.HasLayer(mounted.Layers[0]) {
		t.Fatal("collect removed a mounted layer or kept a loose one")
	}

	n, err = s.Remove(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// a's layer and the no longer mounted m go; b (a template), the pinned
	// and the snapshot's layers stay.
	if n != 2 {
		t.Errorf("Remove collected %d layers, want 2", n)
	}
	for name, l := range map[string]string{"template b": b.Layers[0], "pinned": pinned.Layers[0], "snapshot": snap.Layers[0]} {
		if !s.layers.HasLayer(l) {
			t.Errorf("the %s layer was collected", name)
		}
	}
	if s.layers.HasLayer(a.Layers[0]) {
		t.Error("the removed template's layer was kept")
	}
	if _, err := s.store().GetTemplate(ctx, "a"); !errs.Is(err, errs.NotFound) {
		t.Errorf("template a still there: %v", err)
	}
}

func writeContext(t *testing.T, dockerfile string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["Dockerfile"] = dockerfile
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestServiceBuildWithoutRun(t *testing.T) {
	s, c := newTestService(t)
	ctx := t.Context()
	base, err := s.Import(ctx, "base", bytes.NewReader(tinyTar(t)), "")
	if err != nil {
		t.Fatal(err)
	}
	// COPY chowns to the given owner: the test's own, so no root is needed.
	df := fmt.Sprintf("ARG V=1\nFROM base\nARG V\nENV A=$V B=two\nWORKDIR /app\nCOPY --chown=%d:%d hello.txt ./\nUSER nobody\nCMD [\"sh\", \"-c\", \"echo $A\"]\n",
		os.Getuid(), os.Getgid())
	dirCtx := writeContext(t, df, map[string]string{"hello.txt": "hello\n"})
	var cached []bool
	progress := func(p BuildProgress) {
		if p.Cached != nil {
			cached = append(cached, *p.Cached)
		}
	}
	tp, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: dirCtx, BuildArgs: map[string]string{"V": "9"}}, progress)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Template{Name: "app", State: store.TemplateReady, Source: "dockerfile Dockerfile",
		Env: map[string]string{"A": "9", "B": "two"}, Workdir: "/app", User: "nobody", StartCmd: []string{"sh", "-c", "echo $A"}}
	got := tp
	got.Layers, got.Fingerprint, got.CreatedAt, got.UpdatedAt = nil, "", want.CreatedAt, want.UpdatedAt
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("built template (-want +got):\n%s", diff)
	}
	if len(tp.Layers) != 3 || tp.Layers[2] != base.Layers[0] || tp.Fingerprint != FingerprintOf(tp) {
		t.Fatalf("layers = %v, want COPY, WORKDIR over base %s", tp.Layers, base.Layers[0])
	}
	lowers, err := s.layers.Lowers("app", tp.Layers)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(lowers[0], "app", "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("COPY layer has app/hello.txt = %q, %v", b, err)
	}
	if !slices.Equal(cached, []bool{false, false}) {
		t.Errorf("first build cached = %v, want two fresh layer steps", cached)
	}
	// The same build again is served from the cache; --no-cache is not.
	cached = nil
	tp2, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: dirCtx, BuildArgs: map[string]string{"V": "9"}}, progress)
	if err != nil || tp2.Fingerprint != tp.Fingerprint || !slices.Equal(cached, []bool{true, true}) {
		t.Errorf("rebuild: %v, fingerprint %s vs %s, cached %v; want the same template from the cache", err, tp2.Fingerprint, tp.Fingerprint, cached)
	}
	cached = nil
	if _, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: dirCtx, BuildArgs: map[string]string{"V": "9"}, NoCache: true}, progress); err != nil || !slices.Equal(cached, []bool{false, false}) {
		t.Errorf("--no-cache: %v, cached %v", err, cached)
	}
	// Changed content is a miss for COPY only.
	if err := os.WriteFile(filepath.Join(dirCtx, "hello.txt"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cached = nil
	tp3, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: dirCtx, BuildArgs: map[string]string{"V": "9"}}, progress)
	if err != nil || tp3.Fingerprint == tp.Fingerprint || !slices.Equal(cached, []bool{true, false}) {
		t.Errorf("after a context change: %v, cached %v; want WORKDIR cached, COPY rebuilt", err, cached)
	}
	if len(c.started) != 0 {
		t.Errorf("a build without RUN started sandboxes %v", c.started)
	}
}

func TestServiceBuildRunFailureKeepsTheLastGoodTemplate(t *testing.T) {
	s, c := newTestService(t)
	ctx := t.Context()
	if _, err := s.Import(ctx, "base", bytes.NewReader(tinyTar(t)), ""); err != nil {
		t.Fatal(err)
	}
	good, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: writeContext(t, "FROM base\nWORKDIR /w\n", map[string]string{})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The build sandbox's agent does not answer: RUN fails, the sandbox
	// is removed, the stream closed, and the last good template stays.
	_, err = s.Build(ctx, BuildRequest{Name: "app", ContextDir: writeContext(t, "FROM base\nRUN echo hi\n", map[string]string{})}, nil)
	if !errs.Is(err, errs.Unavailable) || !strings.Contains(err.Error(), "Dockerfile:2: RUN") {
		t.Fatalf("RUN without an agent: %v, want Unavailable at Dockerfile:2", err)
	}
	if len(c.started) != 1 || !slices.Equal(c.started, c.removed) || c.openStrm != 0 {
		t.Errorf("build sandboxes started %v removed %v, streams open %d", c.started, c.removed, c.openStrm)
	}
	rec, err := s.store().GetTemplate(ctx, "app")
	if err != nil || rec.State != store.TemplateReady || rec.Fingerprint != good.Fingerprint {
		t.Errorf("after a failed rebuild: %+v, %v; want the last good template", rec, err)
	}
	// A sandbox that cannot boot fails the step with its kind.
	c.bootErr = errs.E(errs.ResourceExhausted, "quota")
	_, err = s.Build(ctx, BuildRequest{Name: "new", ContextDir: writeContext(t, "FROM base\nRUN true\n", map[string]string{})}, nil)
	if !errs.Is(err, errs.ResourceExhausted) {
		t.Errorf("boot failure: %v, want ResourceExhausted", err)
	}
	if rec, err := s.store().GetTemplate(ctx, "new"); err != nil || rec.State != store.TemplateFailed {
		t.Errorf("record of a failed first build = %+v, %v", rec, err)
	}
}

func TestServicePullOCILayout(t *testing.T) {
	s, _ := newTestService(t)
	ctx := t.Context()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Config.Env = []string{"PATH=/bin", "LANG=C"}
	cf.Config.WorkingDir, cf.Config.User = "/srv", "app"
	cf.Config.Entrypoint, cf.Config.Cmd = []string{"/bin/app"}, []string{"--serve"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	var diffs []string
	for _, l := range ls {
		d, _ := l.DiffID()
		diffs = append(diffs, d.Hex)
	}
	slices.Reverse(diffs)

	// Two pulls of one image at once both get it, stored once.
	var wg sync.WaitGroup
	out := make([]store.Template, 2)
	errsOut := make([]error, 2)
	for i, name := range []string{"img1", "img2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errsOut[i] = s.Pull(ctx, PullRequest{Name: name, Image: "oci-layout:" + dir}, nil)
		}()
	}
	wg.Wait()
	for i := range out {
		if errsOut[i] != nil {
			t.Fatal(errsOut[i])
		}
		tp := out[i]
		if !slices.Equal(tp.Layers, diffs) || tp.Workdir != "/srv" || tp.User != "app" ||
			!slices.Equal(tp.StartCmd, []string{"/bin/app", "--serve"}) || tp.Env["LANG"] != "C" || tp.State != store.TemplateReady {
			t.Errorf("pulled template = %+v, want layers %v top first and the image's config", tp, diffs)
		}
	}
	all, err := s.layers.ListLayers()
	if err != nil || len(all) != 2 {
		t.Errorf("%d layers stored, want 2: %v", len(all), err)
	}

	// A layout that is not there: InvalidArgument on the image field, and
	// the record says it failed.
	_, err = s.Pull(ctx, PullRequest{Name: "gone", Image: "oci-layout:" + filepath.Join(dir, "nope")}, nil)
	var e *errs.Error
	if !errors.As(err, &e) || e.Kind != errs.InvalidArgument || e.Field != "image" {
		t.Errorf("missing layout: %v, want InvalidArgument on image", err)
	}
	if rec, err := s.store().GetTemplate(ctx, "gone"); err != nil || rec.State != store.TemplateFailed {
		t.Errorf("record of a failed pull = %+v, %v", rec, err)
	}
	if _, err := s.Pull(ctx, PullRequest{Name: "x", Image: " "}, nil); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("empty image: %v, want InvalidArgument", err)
	}
}

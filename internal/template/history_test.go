package template

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Every import and build, failed ones included, lands in the template's
// history with its result, fingerprint and duration; a bad name does not.
func TestServiceBuildHistory(t *testing.T) {
	s, _ := newTestService(t)
	ctx := t.Context()
	base, err := s.Import(ctx, "base", bytes.NewReader(tinyTar(t)), "upload")
	if err != nil {
		t.Fatal(err)
	}
	app, err := s.Build(ctx, BuildRequest{Name: "app", ContextDir: writeContext(t, "FROM base\nWORKDIR /w\n", map[string]string{})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Build(ctx, BuildRequest{Name: "app", ContextDir: writeContext(t, "FROM base\nRUN echo hi\n", map[string]string{})}, nil)
	if err == nil {
		t.Fatal("RUN without an agent built")
	}
	if _, err := s.Import(ctx, "bad", strings.NewReader("not a tarball"), "upload"); err == nil {
		t.Fatal("garbage imported")
	}
	if _, err := s.Import(ctx, "Bad Name", bytes.NewReader(tinyTar(t)), ""); !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}

	type row struct{ template, kind, result, fingerprint, source string }
	got := func(name string) []row {
		t.Helper()
		list, err := s.Builds(ctx, name, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []row
		for _, b := range list {
			if b.Duration() < 0 || b.StartedAt.IsZero() {
				t.Errorf("build %d: started %v ended %v", b.Seq, b.StartedAt, b.EndedAt)
			}
			if (b.Result == store.TemplateFailed) != (b.Error != "") {
				t.Errorf("build %d: result %s with error %q", b.Seq, b.Result, b.Error)
			}
			out = append(out, row{b.Template, b.Kind, b.Result, b.Fingerprint, b.Source})
		}
		return out
	}
	wantApp := []row{
		{"app", store.BuildDocker, store.TemplateFailed, "", "dockerfile Dockerfile"},
		{"app", store.BuildDocker, store.TemplateReady, app.Fingerprint, "dockerfile Dockerfile"},
	}
	if g := got("app"); !slices.Equal(g, wantApp) {
		t.Errorf("app history = %+v, want %+v", g, wantApp)
	}
	wantBase := []row{{"base", store.BuildImport, store.TemplateReady, base.Fingerprint, "upload"}}
	if g := got("base"); !slices.Equal(g, wantBase) {
		t.Errorf("base history = %+v, want %+v", g, wantBase)
	}
	if g := got(""); len(g) != 4 || g[0] != (row{"bad", store.BuildImport, store.TemplateFailed, "", "upload"}) {
		t.Errorf("all history = %+v, want 4 builds", g)
	}
	if _, err := s.Builds(ctx, "Bad Name", 0); errs.FieldOf(err) != "name" {
		t.Errorf("Builds(bad name) = %v, want a name field error", err)
	}
}

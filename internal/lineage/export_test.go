package lineage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
)

// exporter is a runsc stand-in for the one call the view makes of it:
// ExportUpper writes tarball (or fails with err).
type exporter struct {
	runtime.Runtime
	tarball []byte
	err     error
	calls   int
}

func (e *exporter) ExportUpper(_ context.Context, _, file string) error {
	e.calls++
	if e.err != nil {
		return e.err
	}
	return os.WriteFile(file, e.tarball, 0o600)
}

type exportCore struct {
	*dirCore
	rt *exporter
}

func (c exportCore) RuntimeFor(*sandbox.Sandbox) (runtime.Runtime, error) { return c.rt, nil }

func upperTar(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "sentry.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg},
		{Name: "gone", Typeflag: tar.TypeChar, Devmajor: 0, Devminor: 0}, // a whiteout
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("hi\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestViewRunscExport: a runsc sandbox that keeps its writes in the
// sentry is seen through the exported upper tar, removed on Close; one
// whose writes are on the host (--overlay2=none: "not an overlayfs") is
// read from the host upper, and the runtime is not asked again.
func TestViewRunscExport(t *testing.T) {
	dir := t.TempDir()
	tpl := digestOf('a')
	writeFiles(t, filepath.Join(dir, "layers", tpl), map[string]string{"gone": "base\n", "kept": "k\n"})
	writeFiles(t, filepath.Join(dir, "sandboxes", "gv", "upper"), map[string]string{"host.txt": "h\n"})
	sb := &sandbox.Sandbox{ID: "gv", Owner: "alice", Runtime: "runsc", State: sandbox.Running, Attrs: sandbox.Attrs{Layers: []string{tpl}}}
	dc := &dirCore{dir: dir, sbs: map[string]*sandbox.Sandbox{"gv": sb}}
	ctx := context.Background()

	rt := &exporter{tarball: upperTar(t)}
	s := New(exportCore{dc, rt}, Config{DataDir: dir})
	res, err := s.Diff(ctx, DiffRequest{ID: "gv"})
	if err != nil {
		t.Fatal(err)
	}
	if got := changeLines(res); len(got) != 2 || got[0] != "deleted gone" || got[1] != "added sentry.txt" {
		t.Fatalf("diff through the export: %q", got)
	}
	v, err := s.View(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if v.UpperTar == "" || v.Upper == "upper:gv" {
		t.Fatalf("view of an exported upper: upper %q tar %q", v.Upper, v.UpperTar)
	}
	if _, err := os.Stat(v.UpperTar); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.UpperTar); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("upper tar after Close: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "lineage", "*")); len(left) != 0 {
		t.Fatalf("scratch left behind: %v", left)
	}

	rt2 := &exporter{err: errs.E(errs.Internal, "runsc tar rootfs-upper gv: \"/\" is not an overlayfs")}
	s2 := New(exportCore{dc, rt2}, Config{DataDir: dir})
	for i := 0; i < 2; i++ {
		res, err := s2.Diff(ctx, DiffRequest{ID: "gv"})
		if err != nil {
			t.Fatal(err)
		}
		if got := changeLines(res); len(got) != 1 || got[0] != "added host.txt" {
			t.Fatalf("diff of the host upper: %q", got)
		}
	}
	if rt2.calls != 1 {
		t.Fatalf("runsc asked %d times, want once", rt2.calls)
	}

	rt3 := &exporter{err: errs.E(errs.Unavailable, "runsc is gone")}
	if _, err := New(exportCore{dc, rt3}, Config{DataDir: dir}).Diff(ctx, DiffRequest{ID: "gv"}); !errs.Is(err, errs.Unavailable) {
		t.Fatalf("a failing export: %v, want its kind kept", err)
	}
}

func changeLines(r *fsdiff.Result) []string {
	var out []string
	for _, c := range r.Changes {
		out = append(out, string(c.Kind)+" "+c.Path)
	}
	return out
}

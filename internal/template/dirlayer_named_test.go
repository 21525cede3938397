package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestImportDirNamed(t *testing.T) {
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := strings.Repeat("ab", 32)
	fill := func(dir string) error {
		if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "d", "f"), []byte("12345"), 0o644)
	}
	l, err := s.ImportDirNamed(ctx, name, fill)
	if err != nil {
		t.Fatal(err)
	}
	if l.Digest != name || l.Entries != 3 || l.TarSize != 5 || l.Path != s.LayerPath(name) {
		t.Fatalf("layer = %+v, want %s with 3 entries and 5 bytes", l, name)
	}
	if b, err := os.ReadFile(filepath.Join(s.LayerPath(name), "d", "f")); err != nil || string(b) != "12345" {
		t.Fatalf("content = %q, %v", b, err)
	}
	got, err := s.Layer(name)
	if err != nil || got.Entries != 3 {
		t.Fatalf("Layer(%s) = %+v, %v", name, got, err)
	}
	// Never deduplicated: the same name again is refused, the layer kept.
	if _, err := s.ImportDirNamed(ctx, name, fill); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("second import: %v, want AlreadyExists", err)
	}
	// Bad names and failing fills leave nothing behind.
	if _, err := s.ImportDirNamed(ctx, "../x", fill); !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("bad name: %v, want InvalidArgument", err)
	}
	other := strings.Repeat("cd", 32)
	if _, err := s.ImportDirNamed(ctx, other, func(string) error { return errs.E(errs.Internal, "boom") }); err == nil {
		t.Fatal("failing fill: no error")
	}
	ls, err := s.ListLayers()
	if err != nil || len(ls) != 1 || ls[0].Digest != name {
		t.Fatalf("layers = %+v, %v; want only %s", ls, err, name)
	}
	ents, _ := os.ReadDir(s.Dir())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Fatalf("left over %s", e.Name())
		}
	}
	// GC and removal go by name: it is removable like any layer.
	if err := s.RemoveLayer(name); err != nil {
		t.Fatal(err)
	}
}

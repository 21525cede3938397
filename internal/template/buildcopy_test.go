package template

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyFillStaysInLayer: a build context is the tenant's. One source
// directory plants dest/foo as a symlink to a host directory (absolute or
// climbing out), the next writes dest/foo/x: the host directory must stay
// untouched, and the layer must not follow the link.
func TestCopyFillStaysInLayer(t *testing.T) {
	for name, target := range map[string]func(host string) string{
		"absolute": func(host string) string { return host },
		"relative": func(host string) string { return "../../../../../../../../../../.." + host },
	} {
		t.Run(name, func(t *testing.T) {
			host := t.TempDir()
			canary := filepath.Join(host, "x")
			if err := os.WriteFile(canary, []byte("canary"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(host, 0o711); err != nil {
				t.Fatal(err)
			}
			ctxDir, layer := t.TempDir(), t.TempDir()
			for _, d := range []string{"a", "b/foo"} {
				if err := os.MkdirAll(filepath.Join(ctxDir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(target(host), filepath.Join(ctxDir, "a", "foo")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ctxDir, "b", "foo", "x"), []byte("evil"), 0o644); err != nil {
				t.Fatal(err)
			}
			spec := CopySpec{Sources: []string{"a", "b"}, Dest: "/dest/"}
			srcs, err := spec.ResolveSources(ctxDir)
			if err != nil {
				t.Fatal(err)
			}
			_ = spec.Fill(ctxDir, srcs, true, layer) // an error is fine; an escape is not
			if b, err := os.ReadFile(canary); err != nil || string(b) != "canary" {
				t.Fatalf("the host file behind the symlink changed: %q, %v", b, err)
			}
			if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o711 {
				t.Fatalf("the host directory behind the symlink changed: %v, %v", fi, err)
			}
			if ents, _ := os.ReadDir(host); len(ents) != 1 {
				t.Fatalf("files appeared in the host directory: %v", ents)
			}
		})
	}
}

// TestCopyFillRefusesSpecialSources: a FIFO in the context is skipped, not
// opened (an open would block the build).
func TestCopyFillRefusesSpecialSources(t *testing.T) {
	ctxDir, layer := t.TempDir(), t.TempDir()
	if err := unix.Mkfifo(filepath.Join(ctxDir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "f"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := CopySpec{Sources: []string{"."}, Dest: "/app/"}
	srcs, err := spec.ResolveSources(ctxDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Fill(ctxDir, srcs, true, layer); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(layer, "app", "f")); err != nil || string(b) != "ok" {
		t.Fatalf("copied file: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(layer, "app", "pipe")); err == nil {
		t.Fatalf("a FIFO was copied into the layer")
	}
}

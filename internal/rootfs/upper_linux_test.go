package rootfs

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testutil"
)

// mountOverlay mounts lowers (top first) under a fresh upper at a new dir.
func mountOverlay(t *testing.T, lowers ...string) (root, upper string) {
	t.Helper()
	dir := t.TempDir()
	root, upper, work := filepath.Join(dir, "root"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{root, upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := overlayData(Layout{Upper: upper, Work: work}, lowers)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("overlay", root, "overlay", 0, data); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	return root, upper
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkAsLower mounts layer over base and checks that deletions and
// replaced directories recorded in layer still hide base's entries.
func checkAsLower(t *testing.T, layer, base string) {
	t.Helper()
	root, _ := mountOverlay(t, layer, base)
	if _, err := os.Stat(filepath.Join(root, "gone")); !os.IsNotExist(err) {
		t.Errorf("whiteout lost: /gone is visible (%v)", err)
	}
	if got := names(t, filepath.Join(root, "dir")); len(got) != 1 || got[0] != "new" {
		t.Errorf("opaque dir lost: /dir has %v, want [new]", got)
	}
	if b, err := os.ReadFile(filepath.Join(root, "kept")); err != nil || string(b) != "kept" {
		t.Errorf("/kept = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "added")); err != nil || string(b) != "added" {
		t.Errorf("/added = %q, %v", b, err)
	}
}

func TestCopyUpperKeepsWhiteouts(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	writeFiles(t, base, map[string]string{"gone": "x", "kept": "kept", "dir/old1": "1", "dir/old2": "2"})
	root, upper := mountOverlay(t, base)
	if err := os.Remove(filepath.Join(root, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(root, "dir")); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, root, map[string]string{"dir/new": "n", "added": "added"})
	layer := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CopyUpper(t.Context(), upper, layer); err != nil {
		t.Fatal(err)
	}
	checkAsLower(t, layer, base)
}

func TestExtractUpperTarKeepsWhiteouts(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	writeFiles(t, base, map[string]string{"gone": "x", "kept": "kept", "dir/old1": "1"})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "./gone", Typeflag: tar.TypeChar, Mode: 0}, "")
	add(&tar.Header{Name: "./dir/", Typeflag: tar.TypeDir, Mode: 0o755,
		PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}, "")
	add(&tar.Header{Name: "./dir/new", Typeflag: tar.TypeReg, Mode: 0o644}, "n")
	add(&tar.Header{Name: "./added", Typeflag: tar.TypeReg, Mode: 0o644}, "added")
	_ = tw.Close()
	layer := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ExtractUpperTar(t.Context(), &buf, layer); err != nil {
		t.Fatal(err)
	}
	checkAsLower(t, layer, base)

	t.Run("refuses escapes", func(t *testing.T) {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644})
		_ = tw.Close()
		if err := ExtractUpperTar(t.Context(), &b, t.TempDir()); err == nil {
			t.Fatal("an entry leaving the root was extracted")
		}
	})
}

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

// specialKinds lists what is left in a captured layer, by name.
func specialKinds(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names(t, dir) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, n), &st); err != nil {
			t.Fatal(err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			out[n] = "chr " + string(rune('0'+unix.Major(st.Rdev))) + "/" + string(rune('0'+unix.Minor(st.Rdev)))
		case unix.S_IFBLK:
			out[n] = "blk"
		case unix.S_IFIFO:
			out[n] = "fifo"
		case unix.S_IFREG:
			out[n] = "reg"
		}
	}
	return out
}

// A sandbox's upper holds the device nodes and FIFOs it made; a layer made
// from it keeps whiteouts and FIFOs, never a device, and reading the upper
// never follows a symlink the sandbox swapped in.
func TestCaptureDropsDeviceNodes(t *testing.T) {
	testutil.RequireRoot(t)
	want := map[string]string{"gone": "chr 0/0", "fifo": "fifo", "file": "reg"}

	t.Run("CopyUpper", func(t *testing.T) {
		upper := t.TempDir()
		writeFiles(t, upper, map[string]string{"file": "x"})
		for name, dev := range map[string]struct {
			mode uint32
			rdev uint64
		}{
			"gone": {unix.S_IFCHR, 0}, "null": {unix.S_IFCHR | 0o666, unix.Mkdev(1, 3)},
			"mem": {unix.S_IFCHR | 0o600, unix.Mkdev(1, 1)}, "sda": {unix.S_IFBLK | 0o600, unix.Mkdev(8, 0)},
			"fifo": {unix.S_IFIFO | 0o644, 0},
		} {
			if err := unix.Mknod(filepath.Join(upper, name), dev.mode, int(dev.rdev)); err != nil {
				t.Fatal(err)
			}
		}
		layer := filepath.Join(t.TempDir(), "layer")
		if err := CopyUpper(t.Context(), upper, layer); err != nil {
			t.Fatal(err)
		}
		if got := specialKinds(t, layer); !equalMap(got, want) {
			t.Fatalf("layer has %v, want %v", got, want)
		}
	})

	t.Run("ExtractUpperTar", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range []*tar.Header{
			{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "./gone", Typeflag: tar.TypeChar},
			{Name: "./null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
			{Name: "./sda", Typeflag: tar.TypeBlock, Mode: 0o600, Devmajor: 8},
			{Name: "./fifo", Typeflag: tar.TypeFifo, Mode: 0o644},
			{Name: "./file", Typeflag: tar.TypeReg, Mode: 0o644},
		} {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		_ = tw.Close()
		layer := filepath.Join(t.TempDir(), "layer")
		if err := os.Mkdir(layer, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := ExtractUpperTar(t.Context(), &buf, layer); err != nil {
			t.Fatal(err)
		}
		if got := specialKinds(t, layer); !equalMap(got, want) {
			t.Fatalf("layer has %v, want %v", got, want)
		}
	})
}

func equalMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestExtractUpperTarDirOverSymlink: a symlink entry to a host directory
// followed by a directory entry of the same name is refused; the host
// directory keeps its mode.
func TestExtractUpperTarDirOverSymlink(t *testing.T) {
	testutil.RequireRoot(t)
	host := t.TempDir()
	if err := os.Chmod(host, 0o711); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./evil", Typeflag: tar.TypeSymlink, Linkname: host},
		{Name: "./evil/", Typeflag: tar.TypeDir, Mode: 0o777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	_ = tw.Close()
	layer := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ExtractUpperTar(t.Context(), &buf, layer); err == nil {
		t.Fatal("a directory entry over a symlink was accepted")
	}
	if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("the host directory behind the symlink changed: %v, %v", fi.Mode(), err)
	}
}

package timeline

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/template"
)

// TestDeltaStampsSkipUnchanged: a delta written with stamps lets the next
// checkpoint's quick diff know an untouched file unchanged without reading
// it, and still see a same-size rewrite; a file changed within the margin
// before the capture gets no stamp (it is copied again, never missed).
func TestDeltaStampsSkipUnchanged(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("trusted.* xattrs need root (CI=true)")
		}
		t.Skip("trusted.* xattrs need root")
	}
	base, upper := t.TempDir(), t.TempDir()
	for name, body := range map[string]string{"kept": "kept bytes", "rewritten": "old bytes!", "late": "late bytes"} {
		if err := os.WriteFile(filepath.Join(upper, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	quick := fsdiff.Options{DigestsOnly: true, NoText: true, QuickCheck: true}
	changed := func(from []string) map[string]bool {
		t.Helper()
		res, err := fsdiff.Diff(t.Context(), dirLayers(t, from...), dirLayers(t, upper), quick)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, c := range res.Changes {
			out[c.Path] = true
		}
		return out
	}
	// The capture "began" a second after the files were written: all
	// three are safely older than it, and get stamps.
	res, err := fsdiff.Diff(t.Context(), dirLayers(t, base), dirLayers(t, upper), quick)
	if err != nil {
		t.Fatal(err)
	}
	d1 := t.TempDir()
	if _, err := WriteDeltaStamped(t.Context(), res, dirLayers(t, upper), d1, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"kept", "rewritten", "late"} {
		buf := make([]byte, 128)
		if _, err := unix.Getxattr(filepath.Join(d1, n), fsdiff.StampXattr, buf); err != nil {
			t.Fatalf("%s has no stamp: %v", n, err)
		}
	}
	if got := changed([]string{d1, base}); len(got) != 0 {
		t.Fatalf("nothing touched, changes %v", got)
	}
	// A same-size rewrite, and a file written just now then captured at
	// once (its ctime within stampMargin of the capture: no stamp).
	mustDo(t, os.WriteFile(filepath.Join(upper, "rewritten"), []byte("new bytes!"), 0o644),
		os.WriteFile(filepath.Join(upper, "late"), []byte("LATE BYTES"), 0o644))
	if got := changed([]string{d1, base}); len(got) != 2 || !got["rewritten"] || !got["late"] {
		t.Fatalf("changes %v, want rewritten and late", got)
	}
	res, err = fsdiff.Diff(t.Context(), dirLayers(t, d1, base), dirLayers(t, upper), quick)
	if err != nil {
		t.Fatal(err)
	}
	d2 := t.TempDir()
	if _, err := WriteDeltaStamped(t.Context(), res, dirLayers(t, upper), d2, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(filepath.Join(d2, "late"), fsdiff.StampXattr, make([]byte, 128)); err != unix.ENODATA {
		t.Fatalf("late got a stamp (%v): a write in the same clock tick could go unseen", err)
	}
	if got := changed([]string{d2, d1, base}); len(got) != 2 {
		t.Fatalf("changes %v, want rewritten and late (no stamps within the margin)", got)
	}
	if b, _ := os.ReadFile(filepath.Join(d2, "rewritten")); string(b) != "new bytes!" {
		t.Fatalf("delta holds %q", b)
	}
}

func TestDeltaNameUniqueAndValid(t *testing.T) {
	changes := []fsdiff.Change{{Path: "a", Kind: fsdiff.Added, New: &fsdiff.Node{Type: fsdiff.TypeFile, Mode: 0o644, Size: 3}}}
	a, b := deltaName("ck-1", changes), deltaName("ck-2", changes)
	if a == b {
		t.Fatal("two checkpoints with the same changes got one name")
	}
	if deltaName("ck-1", nil) == a {
		t.Fatal("the name does not commit to the entry list")
	}
	for _, n := range []string{a, b, deltaName("", nil)} {
		if err := template.ValidateDigest(n); err != nil {
			t.Fatal(err)
		}
	}
	if deltaName("ck-1", changes) != a {
		t.Fatal("not deterministic")
	}
}

package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/fsdiff"
)

// overlayTarget mounts the fixture's target as a real overlay: the base
// as its lower (berth's mount options), the target's own edits made
// through the mount. It returns the merged dir and the inputs over it.
func overlayTarget(t *testing.T) (string, Inputs, Sources) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounting overlayfs needs root (CI=true)")
		}
		t.Skip("mounting overlayfs needs root")
	}
	f := newApplyFixture(t)
	root := t.TempDir()
	up, work, merged := filepath.Join(root, "upper"), filepath.Join(root, "work"), filepath.Join(root, "merged")
	for _, d := range []string{up, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := f.in.Base.Layers()[0]
	baseDir := filepath.Join(filepath.Dir(f.target), "base")
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off,redirect_dir=off,metacopy=off", baseDir, up, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(merged, "etc/conf"), []byte("OURS\n"+text[3:]), 0o644); err != nil {
		t.Fatal(err)
	}
	upper, err := fsdiff.OpenDirLayer(up, "upper:target", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upper.Close() })
	in := Inputs{Base: f.in.Base, Ours: fsdiff.NewTree(upper, base), Theirs: f.in.Theirs}
	return merged, in, Sources{SideBase: in.Base, SideTheirs: in.Theirs}
}

// On a real overlay (a runc sandbox's rootfs as the host sees it), a merge
// applies, and one interrupted at any step rolls back to the same view.
func TestApplyRealOverlay(t *testing.T) {
	merged, in, src := overlayTarget(t)
	p, err := Compute(context.Background(), in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Clean() {
		t.Fatalf("conflicts %v", conflicts(p))
	}
	steps := len(p.Deletes) + len(p.Writes)
	for k := 1; k < steps; k++ {
		before := snapshotDir(t, merged)
		var stored []byte
		save := func(j *Journal) error { stored, err = json.Marshal(j); return err }
		if err := Apply(context.Background(), merged, p, src, "crash", ApplyOptions{Save: save, crashAfter: k}); !errors.Is(err, errCrash) {
			t.Fatalf("step %d: apply: %v, want the simulated crash", k, err)
		}
		var j Journal
		if err := json.Unmarshal(stored, &j); err != nil {
			t.Fatal(err)
		}
		if err := Recover(merged, &j); err != nil {
			t.Fatalf("step %d: recover: %v", k, err)
		}
		if d := cmp.Diff(before, snapshotDir(t, merged)); d != "" {
			t.Fatalf("step %d: view after recovery (-want +got):\n%s", k, d)
		}
	}
	if err := Apply(context.Background(), merged, p, src, "ok", ApplyOptions{Save: func(*Journal) error { return nil },
		BeforeCommit: func() error { return Verify(p, fsdiff.NewTree(in.Ours.Layers()...)) }}); err != nil {
		t.Fatal(err)
	}
	got := snapshotDir(t, merged)
	for path, want := range map[string]string{
		"etc/conf":      "-rw-r--r-- OURS\n" + text[3:len(text)-3] + "THEIRS\n",
		"run.sh":        "-rwxr-xr-x #!/bin/sh\n",
		"new/deep/file": "-rw-r--r-- deep\n",
		"f/inner":       "-rw-r--r-- inner\n",
		"ln":            "Lrwxrwxrwx -> /etc/shadow",
		"d":             "",
		"gone":          "",
	} {
		if got[path] != want {
			t.Errorf("%s: %q, want %q", path, got[path], want)
		}
	}
}

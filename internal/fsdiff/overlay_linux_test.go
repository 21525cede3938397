package fsdiff

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// TestDiffRealOverlay changes files through a real overlayfs mount, with
// berth's mount options, and diffs the upper dir the kernel wrote (its own
// whiteouts and opaque dirs) against the two lower layers.
func TestDiffRealOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounting overlayfs needs root (CI=true)")
		}
		t.Skip("mounting overlayfs needs root")
	}
	root := t.TempDir()
	dirs := map[string]string{}
	for _, d := range []string{"template", "snapshot", "upper", "work", "merged"} {
		dirs[d] = filepath.Join(root, d)
		if err := os.Mkdir(dirs[d], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, body string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	tm, sn := dirs["template"], dirs["snapshot"]
	write(tm+"/etc/conf", "a\nb\nc\n", 0o644)
	write(tm+"/run.sh", "#!/bin/sh\n", 0o644)
	write(tm+"/old.txt", "same bytes\n", 0o644)
	write(tm+"/gone.txt", "bye\n", 0o644)
	write(tm+"/tree/x", "x\n", 0o644)
	write(tm+"/tree/sub/y", "y\n", 0o644)
	write(tm+"/cache/k", "k\n", 0o644)
	write(sn+"/snap.txt", "from the fork point\n", 0o644)
	data := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s,index=off,xino=off,redirect_dir=off,metacopy=off", sn, tm, dirs["upper"], dirs["work"])
	if err := unix.Mount("overlay", dirs["merged"], "overlay", 0, data); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dirs["merged"], unix.MNT_DETACH) })

	m := dirs["merged"]
	write(m+"/etc/conf", "a\nB\nc\n", 0o644)      // edit
	write(m+"/new/file.go", "package x\n", 0o644) // write
	for _, err := range []error{
		os.Remove(m + "/gone.txt"),                              // delete
		os.Rename(m+"/old.txt", m+"/moved.txt"),                 // rename
		os.Chmod(m+"/run.sh", 0o755),                            // mode only
		os.RemoveAll(m + "/tree"),                               // directory delete
		os.RemoveAll(m + "/cache"), os.Mkdir(m+"/cache", 0o700), // replaced dir: opaque
		os.WriteFile(m+"/cache/fresh", []byte("f\n"), 0o600),
		os.Symlink("/etc/shadow", m+"/esc"), // hostile symlink
		os.Remove(m + "/snap.txt"),          // delete from the snapshot layer
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Unmount(m, 0); err != nil {
		t.Fatal(err)
	}
	var layers []*DirLayer
	for _, d := range []string{"upper", "snapshot", "template"} {
		l, err := OpenDirLayer(dirs[d], d, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		layers = append(layers, l)
	}
	up, snap, tmpl := layers[0], layers[1], layers[2]
	r, err := Diff(context.Background(), NewTree(snap, tmpl), NewTree(up, snap, tmpl), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []brief{
		{Path: "cache", Kind: Modified, Mode: true},
		{Path: "cache/fresh", Kind: Added, Plus: 1},
		{Path: "cache/k", Kind: Deleted, Minus: 1},
		{Path: "esc", Kind: Added},
		{Path: "etc/conf", Kind: Modified, Content: true, Plus: 1, Minus: 1},
		{Path: "gone.txt", Kind: Deleted, Minus: 1},
		{Path: "moved.txt", Kind: Added, RenamedFrom: "old.txt", Plus: 1},
		{Path: "new", Kind: Added},
		{Path: "new/file.go", Kind: Added, Plus: 1},
		{Path: "old.txt", Kind: Deleted, RenamedTo: "moved.txt", Minus: 1},
		{Path: "run.sh", Kind: Modified, Mode: true},
		{Path: "snap.txt", Kind: Deleted, Minus: 1},
		{Path: "tree", Kind: Deleted},
		{Path: "tree/sub", Kind: Deleted},
		{Path: "tree/sub/y", Kind: Deleted, Minus: 1},
		{Path: "tree/x", Kind: Deleted, Minus: 1},
	}
	if d := cmp.Diff(want, briefs(r)); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
}

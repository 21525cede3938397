package timeline

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/testutil"
)

// overlayFS is a real overlayfs mount with berth's options over lowers
// (top first) and its own upper.
type overlayFS struct {
	t                   *testing.T
	upper, work, merged string
	lowers              []string
}

func newOverlay(t *testing.T, lowers ...string) *overlayFS {
	root := t.TempDir()
	o := &overlayFS{t: t, upper: root + "/upper", work: root + "/work", merged: root + "/merged", lowers: lowers}
	for _, d := range []string{o.upper, o.work, o.merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o.mount()
	return o
}

func (o *overlayFS) mount() {
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off,redirect_dir=off,metacopy=off",
		strings.Join(o.lowers, ":"), o.upper, o.work)
	if err := unix.Mount("overlay", o.merged, "overlay", 0, data); err != nil {
		o.t.Fatalf("mount overlay: %v", err)
	}
	o.t.Cleanup(func() { _ = unix.Unmount(o.merged, unix.MNT_DETACH) })
}

func (o *overlayFS) unmount() {
	if err := unix.Unmount(o.merged, 0); err != nil {
		o.t.Fatal(err)
	}
}

// snapshotTree describes every object of a tree (type, mode, owner,
// content digest or symlink target), devices left out.
func snapshotTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("%o %d:%d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += " " + hex.EncodeToString(sum[:8])
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case unix.S_IFDIR:
			desc = fmt.Sprintf("%o %d:%d", st.Mode, st.Uid, st.Gid)
		case unix.S_IFCHR, unix.S_IFBLK:
			return nil
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func dirLayers(t *testing.T, dirs ...string) *fsdiff.Tree {
	t.Helper()
	var ls []fsdiff.Layer
	for _, d := range dirs {
		l, err := fsdiff.OpenDirLayer(d, d, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	return fsdiff.NewTree(ls...)
}

// writeDelta diffs view from against view to and writes the delta into a
// fresh dir.
func writeDelta(t *testing.T, from, to []string) (string, DeltaStat) {
	t.Helper()
	res, err := fsdiff.Diff(t.Context(), dirLayers(t, from...), dirLayers(t, to...), fsdiff.Options{DigestsOnly: true, NoText: true})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	st, err := WriteDelta(t.Context(), res, dirLayers(t, to...), dst)
	if err != nil {
		t.Fatalf("WriteDelta: %v", err)
	}
	return dst, st
}

func mustDo(t *testing.T, errs ...error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
}

// TestWriteDeltaRealOverlay changes files through a real overlay mount in
// two rounds, writes a delta layer after each, and checks with the kernel
// that [Δ2, Δ1, template] mounted over an empty upper shows exactly the
// tree the sandbox saw after round two, [Δ1, template] exactly the tree
// after round one, and that Δ2 holds round two's changes only.
func TestWriteDeltaRealOverlay(t *testing.T) {
	testutil.RequireRoot(t)
	tpl := t.TempDir()
	write := func(p, body string, mode os.FileMode) error {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(body), mode)
	}
	mustDo(t, write(tpl+"/etc/conf", "a\nb\n", 0o644), write(tpl+"/keep.txt", "k\n", 0o644),
		write(tpl+"/gone.txt", "bye\n", 0o644), write(tpl+"/tree/x", "x\n", 0o644),
		write(tpl+"/tree/sub/y", "y\n", 0o644), write(tpl+"/cache/old", "o\n", 0o644), write(tpl+"/f2d", "file\n", 0o644))
	o := newOverlay(t, tpl)
	m := o.merged
	big := make([]byte, 3<<20+17) // more than one copy_file_range chunk of a page
	for i := range big {
		big[i] = byte(i * 7)
	}
	mustDo(t, write(m+"/etc/conf", "a\nB\n", 0o600), write(m+"/new/deep/file", "n\n", 0o640),
		os.WriteFile(m+"/big.bin", big, 0o644), os.Remove(m+"/gone.txt"), os.RemoveAll(m+"/tree"),
		os.RemoveAll(m+"/cache"), os.Mkdir(m+"/cache", 0o700), write(m+"/cache/fresh", "f\n", 0o600),
		os.Remove(m+"/f2d"), os.Mkdir(m+"/f2d", 0o755), write(m+"/f2d/in", "i\n", 0o644),
		os.Chown(m+"/keep.txt", 1000, 1000), os.Chmod(m+"/keep.txt", 0o4755),
		unix.Mkfifo(m+"/fifo", 0o620))
	round1 := snapshotTree(t, m)
	o.unmount()
	d1, st1 := writeDelta(t, []string{tpl}, []string{o.upper, tpl})
	if st1.Whiteouts == 0 || st1.Files < 5 || st1.Bytes < int64(len(big)) {
		t.Errorf("delta 1 stat = %+v; want whiteouts, ≥5 files, ≥%d bytes", st1, len(big))
	}
	// Round two, on the same upper (the sandbox keeps running).
	o.mount()
	mustDo(t, write(m+"/etc/conf", "a\nB\nC\n", 0o600), os.Remove(m+"/big.bin"), write(m+"/r2.txt", "two\n", 0o644),
		os.Remove(m+"/keep.txt"), os.Symlink("/etc/shadow", m+"/esc"))
	round2 := snapshotTree(t, m)
	o.unmount()
	d2, st2 := writeDelta(t, []string{d1, tpl}, []string{o.upper, tpl})

	// Δ2 holds only round two: the changed conf, the new file, the symlink,
	// whiteouts for big.bin and keep.txt; nothing of round one's other files.
	got := snapshotTree(t, d2)
	var names []string
	for p := range got {
		names = append(names, p)
	}
	slices.Sort(names)
	if d := cmp.Diff([]string{".", "esc", "etc", "etc/conf", "r2.txt"}, names); d != "" {
		t.Errorf("delta 2 holds (-want +got, devices left out):\n%s", d)
	}
	if st2.Whiteouts != 2 || st2.Bytes != int64(len("a\nB\nC\n")+len("two\n")) {
		t.Errorf("delta 2 stat = %+v; want 2 whiteouts and only round two's bytes", st2)
	}
	if target, err := os.Readlink(d2 + "/esc"); err != nil || target != "/etc/shadow" {
		t.Errorf("esc in delta = %q, %v; want the symlink itself", target, err)
	}

	// The kernel's view of each checkpoint is the tree the sandbox saw.
	for _, tc := range []struct {
		name   string
		lowers []string
		want   map[string]string
	}{
		{"checkpoint 1", []string{d1, tpl}, round1},
		{"checkpoint 2", []string{d2, d1, tpl}, round2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newOverlay(t, tc.lowers...)
			if d := cmp.Diff(tc.want, snapshotTree(t, r.merged)); d != "" {
				t.Errorf("view of %s (-sandbox saw +rewound view):\n%s", tc.name, d)
			}
		})
	}
}

// TestWriteDeltaHostile plants what a sandbox root would, in its upper:
// symlinks to host paths (at a file and at a directory that later paths
// go through), a device node, a hard link to a file of the layer. The
// delta writer never follows a link, leaves the device out, and writes
// nothing outside its layer dir.
func TestWriteDeltaHostile(t *testing.T) {
	testutil.RequireRoot(t)
	tpl, upper := t.TempDir(), t.TempDir()
	host := t.TempDir() // stands for host paths the links point at
	mustDo(t, os.WriteFile(host+"/secret", []byte("host secret\n"), 0o600), os.Mkdir(tpl+"/d", 0o755),
		os.WriteFile(tpl+"/d/f", []byte("tpl\n"), 0o644))
	before := snapshotTree(t, host)
	mustDo(t,
		os.Symlink(host+"/secret", upper+"/secretlink"),
		os.Symlink(host, upper+"/hostdir"),
		os.Mkdir(upper+"/d", 0o755), // d/f below stays
		os.WriteFile(upper+"/d/g", []byte("g\n"), 0o644),
		os.Link(upper+"/d/g", upper+"/hard"),
		unix.Mknod(upper+"/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))),
		unix.Mknod(upper+"/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))),
	)
	dst, st := writeDelta(t, []string{tpl}, []string{upper, tpl})
	if d := cmp.Diff([]string{"mem", "sda"}, slices.Sorted(slices.Values(st.Refused))); d != "" {
		t.Errorf("refused (-want +got):\n%s", d)
	}
	for _, p := range []string{"sda", "mem"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !os.IsNotExist(err) {
			t.Errorf("device %s in the delta layer: %v", p, err)
		}
	}
	for p, want := range map[string]string{"secretlink": host + "/secret", "hostdir": host} {
		if target, err := os.Readlink(filepath.Join(dst, p)); err != nil || target != want {
			t.Errorf("%s = %q, %v; want the symlink to %s, not what it points at", p, target, err, want)
		}
	}
	var st1, st2 unix.Stat_t
	mustDo(t, unix.Lstat(dst+"/hard", &st1), unix.Lstat(dst+"/d/g", &st2))
	if st1.Ino == st2.Ino || st1.Nlink != 1 {
		t.Errorf("hard link kept as a link into the layer (nlink %d)", st1.Nlink)
	}
	if d := cmp.Diff(before, snapshotTree(t, host)); d != "" {
		t.Errorf("host dir changed (-before +after):\n%s", d)
	}
	if _, err := os.Lstat(dst + "/d/f"); !os.IsNotExist(err) {
		t.Errorf("unchanged d/f copied into the delta: %v", err)
	}
}

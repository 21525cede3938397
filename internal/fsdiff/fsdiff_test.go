package fsdiff

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// ent describes one tar entry of a test layer.
type ent struct {
	name   string
	typ    byte // tar type flag; 0 = regular
	body   string
	mode   int64
	uid    int
	target string
	opaque bool
}

func file(name, body string) ent { return ent{name: name, body: body, mode: 0o644} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func whiteout(name string) ent   { return ent{name: name, typ: tar.TypeChar} }
func symlink(name, to string) ent {
	return ent{name: name, typ: tar.TypeSymlink, target: to, mode: 0o777}
}
func opaqueDir(name string) ent    { e := dir(name); e.opaque = true; return e }
func withMode(e ent, m int64) ent  { e.mode = m; return e }
func withOwner(e ent, uid int) ent { e.uid = uid; return e }
func device(name string) ent       { return ent{name: name, typ: tar.TypeBlock, mode: 0o600} }
func sum(s string) string          { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
func fnode(body string, mode uint32) *Node {
	return &Node{Type: TypeFile, Mode: mode, Size: int64(len(body)), SHA256: sum(body)}
}

func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, Typeflag: e.typ, Linkname: e.target, Format: tar.FormatPAX}
		if e.typ == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 8, 0
		}
		if e.opaque {
			h.PAXRecords = map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tarLayer(t testing.TB, id string, ents ...ent) *TarLayer {
	t.Helper()
	l, err := NewTarLayer(id, bytes.NewReader(tarBytes(t, ents...)), TarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// base is the template every case starts from.
func base(t testing.TB) *TarLayer {
	return tarLayer(t, "template",
		dir("etc"), file("etc/hosts", "127.0.0.1 localhost\n"),
		dir("src"), file("src/main.go", "package main\n\nfunc main() {\n\tprintln(1)\n}\n"),
		file("src/util.go", "package main\n"), file("src/old.txt", "moved content\n"),
		dir("data"), file("data/blob.bin", "\x00\x01\x02"), file("data/a", "a\n"), file("data/b", "b\n"),
		dir("data/sub"), file("data/sub/c", "c\n"),
		file("run.sh", "#!/bin/sh\n"),
		symlink("link", "etc/hosts"),
	)
}

// brief strips a change to what the table compares.
type brief struct {
	Path                         string
	Kind                         Kind
	Content, Mode, Owner, TypeCh bool
	Binary                       bool
	Refused                      bool
	RenamedFrom, RenamedTo       string
	Plus, Minus                  int
}

func briefs(r *Result) []brief {
	var out []brief
	for _, c := range r.Changes {
		out = append(out, brief{c.Path, c.Kind, c.ContentChanged, c.ModeChanged, c.OwnerChanged, c.TypeChanged,
			c.Binary, c.Refused != "", c.RenamedFrom, c.RenamedTo, c.LinesAdded, c.LinesRemoved})
	}
	return out
}

func TestDiffUpperAgainstBase(t *testing.T) {
	for _, tc := range []struct {
		name  string
		upper []ent
		opts  Options
		want  []brief
	}{
		{"nothing", nil, Options{}, nil},
		{"copied-up parents only", []ent{dir("src"), dir("data")}, Options{}, nil},
		{
			"write, edit, delete, rename",
			[]ent{
				dir("src"),
				file("src/new.go", "package main\n// new\n"),
				file("src/main.go", "package main\n\nfunc main() {\n\tprintln(2)\n}\n"),
				whiteout("src/util.go"),
				whiteout("src/old.txt"), file("src/renamed.txt", "moved content\n"),
			},
			Options{},
			[]brief{
				{Path: "src/main.go", Kind: Modified, Content: true, Plus: 1, Minus: 1},
				{Path: "src/new.go", Kind: Added, Plus: 2},
				{Path: "src/old.txt", Kind: Deleted, RenamedTo: "src/renamed.txt", Minus: 1},
				{Path: "src/renamed.txt", Kind: Added, RenamedFrom: "src/old.txt", Plus: 1},
				{Path: "src/util.go", Kind: Deleted, Minus: 1},
			},
		},
		{
			"mode change without content change",
			[]ent{withMode(file("run.sh", "#!/bin/sh\n"), 0o755)},
			Options{},
			[]brief{{Path: "run.sh", Kind: Modified, Mode: true}},
		},
		{
			"owner change",
			[]ent{dir("etc"), withOwner(file("etc/hosts", "127.0.0.1 localhost\n"), 1000)},
			Options{},
			[]brief{{Path: "etc/hosts", Kind: Modified, Owner: true}},
		},
		{
			"symlink retargeted and added, file replaced by symlink",
			[]ent{symlink("link", "/etc/shadow"), symlink("esc", "../../../../etc/passwd"), symlink("run.sh", "/bin/true")},
			Options{},
			[]brief{
				{Path: "esc", Kind: Added},
				{Path: "link", Kind: Modified, Content: true},
				{Path: "run.sh", Kind: Modified, TypeCh: true, Minus: 1}, // the old text is removed
			},
		},
		{
			"device node refused",
			[]ent{device("sda")},
			Options{},
			[]brief{{Path: "sda", Kind: Added, Refused: true}},
		},
		{
			"binary edit",
			[]ent{dir("data"), file("data/blob.bin", "\x00\x01\x02\x03")},
			Options{},
			[]brief{{Path: "data/blob.bin", Kind: Modified, Content: true, Binary: true}},
		},
		{
			"text over the limit is binary",
			[]ent{dir("data"), file("data/a", strings.Repeat("x\n", 100))},
			Options{MaxTextBytes: 64},
			[]brief{{Path: "data/a", Kind: Modified, Content: true, Binary: true}},
		},
		{
			"directory deleted",
			[]ent{whiteout("data")},
			Options{},
			[]brief{
				{Path: "data", Kind: Deleted},
				{Path: "data/a", Kind: Deleted, Minus: 1},
				{Path: "data/b", Kind: Deleted, Minus: 1},
				{Path: "data/blob.bin", Kind: Deleted, Binary: true},
				{Path: "data/sub", Kind: Deleted},
				{Path: "data/sub/c", Kind: Deleted, Minus: 1},
			},
		},
		{
			"opaque directory replaces its lower contents",
			[]ent{opaqueDir("data"), file("data/a", "a\n"), file("data/z", "z\n")},
			Options{},
			[]brief{
				{Path: "data/b", Kind: Deleted, Minus: 1},
				{Path: "data/blob.bin", Kind: Deleted, Binary: true},
				{Path: "data/sub", Kind: Deleted},
				{Path: "data/sub/c", Kind: Deleted, Minus: 1},
				{Path: "data/z", Kind: Added, Plus: 1},
			},
		},
		{
			"file replaces a directory",
			[]ent{file("data", "now a file\n")},
			Options{},
			[]brief{
				{Path: "data", Kind: Modified, TypeCh: true, Mode: true, Plus: 1},
				{Path: "data/a", Kind: Deleted, Minus: 1},
				{Path: "data/b", Kind: Deleted, Minus: 1},
				{Path: "data/blob.bin", Kind: Deleted, Binary: true},
				{Path: "data/sub", Kind: Deleted},
				{Path: "data/sub/c", Kind: Deleted, Minus: 1},
			},
		},
		{
			"path filters",
			[]ent{dir("src"), file("src/new.go", "x\n"), file("top.go", "y\n"), whiteout("data")},
			Options{Paths: []string{"*.go", "data/sub"}},
			[]brief{
				{Path: "data/sub", Kind: Deleted},
				{Path: "data/sub/c", Kind: Deleted, Minus: 1},
				{Path: "src/new.go", Kind: Added, Plus: 1},
				{Path: "top.go", Kind: Added, Plus: 1},
			},
		},
		{
			"gVisor filestore left out",
			[]ent{file(".gvisor.filestore.123", "junk")},
			Options{},
			nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lower := base(t)
			from := NewTree(lower)
			to := NewTree(tarLayer(t, "upper", tc.upper...), lower)
			r, err := Diff(context.Background(), from, to, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, briefs(r)); d != "" {
				t.Errorf("changes (-want +got):\n%s", d)
			}
		})
	}
}

func TestDiffDetails(t *testing.T) {
	lower := base(t)
	upper := tarLayer(t, "upper",
		dir("src"), file("src/main.go", "package main\n\nfunc main() {\n\tprintln(2)\n}\n"),
		dir("data"), file("data/blob.bin", "\x00\x01\x02\x03"),
		symlink("link", "/etc/shadow"))
	r, err := Diff(context.Background(), NewTree(lower), NewTree(upper, lower), Options{})
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]Change{}
	for _, c := range r.Changes {
		byPath[c.Path] = c
	}
	wantUnified := `--- a/src/main.go
+++ b/src/main.go
@@ -1,5 +1,5 @@
 package main
 
 func main() {
-	println(1)
+	println(2)
 }
`
	if got := byPath["src/main.go"].Unified; got != wantUnified {
		t.Errorf("unified:\n%s\nwant:\n%s", got, wantUnified)
	}
	blob := byPath["data/blob.bin"]
	if d := cmp.Diff(fnode("\x00\x01\x02", 0o644), blob.Old); d != "" {
		t.Errorf("old blob (-want +got):\n%s", d)
	}
	if d := cmp.Diff(fnode("\x00\x01\x02\x03", 0o644), blob.New); d != "" {
		t.Errorf("new blob (-want +got):\n%s", d)
	}
	if l := byPath["link"]; l.Old.Target != "etc/hosts" || l.New.Target != "/etc/shadow" {
		t.Errorf("symlink targets %q -> %q", l.Old.Target, l.New.Target)
	}
	var stat, patch bytes.Buffer
	if err := r.WriteStat(&stat); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stat.String(), "3 paths changed (0 added, 0 deleted, 3 modified), 1 insertions(+), 1 deletions(-)") {
		t.Errorf("stat:\n%s", stat.String())
	}
	if err := r.WritePatch(&patch); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(patch.String(), "Binary data/blob.bin modified: 3 bytes") || !strings.Contains(patch.String(), "-\tprintln(1)") {
		t.Errorf("patch:\n%s", patch.String())
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(r, &back); d != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", d)
	}
}

// Two forks of one snapshot: only their own uppers are walked, and the
// diff between them is what one did that the other did not.
func TestDiffBetweenForks(t *testing.T) {
	lower := base(t)
	snap := tarLayer(t, "snapshot", dir("src"), file("src/main.go", "package main\n// forked\n"), whiteout("run.sh"))
	a := tarLayer(t, "fork-a", dir("src"), file("src/a.go", "a\n"), file("src/same.go", "s\n"))
	b := tarLayer(t, "fork-b", dir("src"), file("src/b.go", "b\n"), file("src/same.go", "s\n"), file("src/main.go", "package main\n// forked\n// b\n"), whiteout("etc"))
	r, err := Diff(context.Background(), NewTree(a, snap, lower), NewTree(b, snap, lower), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []brief{
		{Path: "etc", Kind: Deleted},
		{Path: "etc/hosts", Kind: Deleted, Minus: 1},
		{Path: "src/a.go", Kind: Deleted, Minus: 1},
		{Path: "src/b.go", Kind: Added, Plus: 1},
		{Path: "src/main.go", Kind: Modified, Content: true, Plus: 1},
	}
	if d := cmp.Diff(want, briefs(r)); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	if got := unshared(NewTree(a, snap, lower), NewTree(b, snap, lower)); len(got) != 1 || got[0].ID() != "fork-a" {
		t.Errorf("unshared layers %v, want only fork-a", got)
	}
}

func TestTarLayerRefusesEscapes(t *testing.T) {
	for _, ents := range [][]ent{
		{file("../evil", "x")},
		{file("a/../../evil", "x")},
		{{name: "hl", typ: tar.TypeLink, target: "../etc/passwd"}},
		{{name: "hl", typ: tar.TypeLink, target: "missing"}},
	} {
		if _, err := NewTarLayer("bad", bytes.NewReader(tarBytes(t, ents...)), TarOptions{}); err == nil {
			t.Errorf("tar %v accepted", ents)
		}
	}
	if _, err := NewTarLayer("big", bytes.NewReader(tarBytes(t, file("a", "1"), file("b", "2"))), TarOptions{MaxEntries: 1}); err == nil {
		t.Error("tar over MaxEntries accepted")
	}
}

func TestDiffEntryLimit(t *testing.T) {
	lower := base(t)
	_, err := Diff(context.Background(), NewTree(lower), NewTree(tarLayer(t, "u", whiteout("data")), lower), Options{MaxEntries: 3})
	if err == nil {
		t.Fatal("diff past MaxEntries succeeded")
	}
}

// writeDirLayer materialises a layer as a real directory the way an
// overlay upper holds it (whiteouts as 0/0 char devices, which an
// unprivileged user may make since Linux 5.8).
func writeDirLayer(t *testing.T, ents ...ent) string {
	t.Helper()
	root := t.TempDir()
	for _, e := range ents {
		p := filepath.Join(root, e.name)
		var err error
		switch e.typ {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(e.mode))
			if err == nil && e.opaque {
				err = unix.Setxattr(p, opaqueXattr, []byte("y"), 0)
			}
		case tar.TypeChar:
			err = unix.Mknod(p, unix.S_IFCHR, 0)
		case tar.TypeSymlink:
			err = os.Symlink(e.target, p)
		default:
			err = os.WriteFile(p, []byte(e.body), os.FileMode(e.mode))
			if err == nil {
				err = os.Chmod(p, os.FileMode(e.mode))
			}
		}
		if err != nil {
			t.Fatalf("make %s: %v", e.name, err)
		}
	}
	return root
}

func openDir(t *testing.T, dir, id string) *DirLayer {
	l, err := OpenDirLayer(dir, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The same cases on real directories, with a hostile upper: a symlinked
// directory pointing at the host's /etc is reported as a symlink, and
// nothing beneath it (the host's files) is listed or read.
func TestDiffDirLayers(t *testing.T) {
	lowerDir := writeDirLayer(t, dir("src"), file("src/main.go", "one\ntwo\nthree\n"), file("src/gone.go", "x\n"),
		withMode(file("run.sh", "#!/bin/sh\n"), 0o644), dir("data"), file("data/a", "a\n"), dir("cfg"), file("cfg/k", "v\n"))
	upperDir := writeDirLayer(t, dir("src"), file("src/main.go", "one\n2\nthree\n"), whiteout("src/gone.go"),
		withMode(file("run.sh", "#!/bin/sh\n"), 0o755), symlink("cfg", "/etc"), file("new.txt", "hello\n"), dir("data"))
	// A FIFO over a lower file: opening it would block the host forever.
	if err := unix.Mkfifo(filepath.Join(upperDir, "data/a"), 0o644); err != nil {
		t.Fatal(err)
	}
	lower, upper := openDir(t, lowerDir, "lower"), openDir(t, upperDir, "upper")
	r, err := Diff(context.Background(), NewTree(lower), NewTree(upper, lower), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []brief{
		{Path: "cfg", Kind: Modified, TypeCh: true},
		{Path: "cfg/k", Kind: Deleted, Minus: 1},
		{Path: "data/a", Kind: Modified, TypeCh: true, Minus: 1},
		{Path: "new.txt", Kind: Added, Plus: 1},
		{Path: "run.sh", Kind: Modified, Mode: true},
		{Path: "src/gone.go", Kind: Deleted, Minus: 1},
		{Path: "src/main.go", Kind: Modified, Content: true, Plus: 1, Minus: 1},
	}
	if d := cmp.Diff(want, briefs(r)); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	for _, c := range r.Changes {
		if c.Path == "cfg" && (c.New.Type != TypeSymlink || c.New.Target != "/etc") {
			t.Errorf("cfg reported as %+v, want a symlink to /etc", c.New)
		}
	}
	// Reading through the planted symlink is refused, never followed.
	if _, err := NewTree(upper, lower).ReadFile("cfg/passwd", 1<<20); err == nil {
		t.Error("read through a planted symlink succeeded")
	}
	if _, err := upper.Open("cfg/passwd"); err == nil {
		t.Error("layer opened a path through a symlink")
	}
}

func TestDiffDirOpaqueNeedsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("trusted.overlay.opaque needs root (CI=true)")
		}
		t.Skip("trusted.* xattrs need root; the tar cases cover opaque dirs")
	}
	lowerDir := writeDirLayer(t, dir("d"), file("d/x", "x\n"), file("d/y", "y\n"))
	upperDir := writeDirLayer(t, opaqueDir("d"), file("d/y", "y\n"))
	lower, upper := openDir(t, lowerDir, "lower"), openDir(t, upperDir, "upper")
	r, err := Diff(context.Background(), NewTree(lower), NewTree(upper, lower), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]brief{{Path: "d/x", Kind: Deleted, Minus: 1}}, briefs(r)); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
}

func TestDiffDigestsOnly(t *testing.T) {
	lower := base(t)
	upper := tarLayer(t, "upper", dir("src"), file("src/main.go", "changed\n"), file("src/new.go", "new\n"))
	r, err := Diff(context.Background(), NewTree(lower), NewTree(upper, lower), Options{DigestsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []brief{{Path: "src/main.go", Kind: Modified, Content: true}, {Path: "src/new.go", Kind: Added}}
	if d := cmp.Diff(want, briefs(r)); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	for _, c := range r.Changes {
		if c.New.SHA256 != sum(map[string]string{"src/main.go": "changed\n", "src/new.go": "new\n"}[c.Path]) || c.Unified != "" {
			t.Errorf("%s: digest %q, unified %q", c.Path, c.New.SHA256, c.Unified)
		}
	}
}

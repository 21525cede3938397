package agent_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
)

type tarEntry struct {
	name, body string
	typ        byte
	mode       int64
	link       string
}

func tarOf(t *testing.T, ents ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Size: int64(len(e.body)), Linkname: e.link}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestBatchWriteAndRead(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	res, err := e.client.WriteBatch(ctx, "proj", "", nil, tarOf(t,
		tarEntry{name: "a.txt", body: "alpha"},
		tarEntry{name: "src/", typ: tar.TypeDir, mode: 0o750},
		tarEntry{name: "src/deep/b.go", body: "package b", mode: 0o600},
		tarEntry{name: "a.txt", body: "alpha again"}, // a later entry wins, as in tar
	))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(e.home, "proj")
	if res.Dir != root || res.Files != 3 || res.Dirs != 1 || res.Durable != "syncfs" || res.Bytes != int64(len("alpha")+len("package b")+len("alpha again")) {
		t.Fatalf("result: %+v", res)
	}
	for p, want := range map[string]string{"a.txt": "alpha again", "src/deep/b.go": "package b"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", p, b, err, want)
		}
		if o := ownerOf(t, filepath.Join(root, p)); o != [2]uint32{nobody, nobody} {
			t.Errorf("%s owned by %v", p, o)
		}
	}
	for p, want := range map[string]os.FileMode{"src": 0o750 | os.ModeDir, "src/deep": 0o755 | os.ModeDir, "src/deep/b.go": 0o600} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v %v, want %v", p, fi.Mode(), err, want)
		}
		if o := ownerOf(t, filepath.Join(root, p)); o != [2]uint32{nobody, nobody} {
			t.Errorf("%s owned by %v", p, o)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}

	rc, err := e.client.ReadBatch(ctx, "proj", "")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(h.Typeflag) + ":" + string(b) + h.Linkname
	}
	want := map[string]string{"a.txt": "0:alpha again", "link": "2:/etc/passwd", "src/": "5:", "src/deep/": "5:", "src/deep/b.go": "0:package b"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("tar of the tree (-want +got):\n%s", d)
	}
}

// TestBatchFreshDirAndModes: into a directory the batch creates, a name
// written twice keeps the first's bits for mode 0 (no lookup happens there:
// the batch knows what it wrote), bits the umask would take are still set,
// and a file planted beside the batch in an existing directory keeps its
// bits for mode 0.
func TestBatchFreshDirAndModes(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	old := filepath.Join(e.home, "old")
	mustMkdir(t, old)
	writeFile(t, filepath.Join(old, "kept"), "x")
	if err := os.Chmod(filepath.Join(old, "kept"), 0o751); err != nil {
		t.Fatal(err)
	}
	tw := func(name, body string, mode int64) tarEntry { return tarEntry{name: name, body: body, mode: mode} }
	ents := []tarEntry{tw("f/a", "1", 0o640), tw("f/wide", "2", 0o777), tw("f/a", "3", 0), tw("f/b", "4", 0)}
	// tarOf turns mode 0 into 0644: write the zero-mode entries by hand.
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, en := range ents {
		_ = w.WriteHeader(&tar.Header{Name: en.name, Typeflag: tar.TypeReg, Mode: en.mode, Size: int64(len(en.body))})
		_, _ = io.WriteString(w, en.body)
	}
	_ = w.Close()
	if _, err := e.client.WriteBatch(ctx, "new", "", nil, &buf); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	w = tar.NewWriter(&buf)
	_ = w.WriteHeader(&tar.Header{Name: "kept", Typeflag: tar.TypeReg, Mode: 0, Size: 1})
	_, _ = io.WriteString(w, "y")
	_ = w.Close()
	if _, err := e.client.WriteBatch(ctx, "old", "", nil, &buf); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"new/f/a": 0o640, "new/f/wide": 0o777, "new/f/b": 0o644, "old/kept": 0o751} {
		fi, err := os.Lstat(filepath.Join(e.home, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v %v, want %v", p, fi.Mode(), err, want)
		}
		if o := ownerOf(t, filepath.Join(e.home, p)); o != [2]uint32{nobody, nobody} {
			t.Errorf("%s owned by %v", p, o)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(e.home, "new/f/a")); string(b) != "3" {
		t.Errorf("new/f/a = %q, want the later entry's", b)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.home, "new/f")); len(ents) != 3 {
		t.Errorf("new/f holds %d entries, want 3 (no temporaries left)", len(ents))
	}
}

// TestBatchHostSync: asked for sync=host, the agent leaves the barrier of
// its root filesystem (and only that one) to the caller and says so.
func TestBatchHostSync(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var root, dir syscall.Stat_t
	if err := syscall.Stat("/", &root); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(e.home, &dir); err != nil {
		t.Fatal(err)
	}
	want := "syncfs"
	if root.Dev == dir.Dev {
		want = agentapi.DurableHost
	}
	res, err := e.client.WriteBatchOptions(ctx, "h", "", nil, tarOf(t, tarEntry{name: "a", body: "x"}), agentapi.BatchOptions{HostSync: true})
	if err != nil || res.Durable != want || res.Files != 1 {
		t.Fatalf("host sync: %+v %v, want durable %q", res, err, want)
	}
	res, err = e.client.WriteBatch(ctx, "h", "", nil, tarOf(t, tarEntry{name: "a", body: "y"}))
	if err != nil || res.Durable != "syncfs" {
		t.Fatalf("without host sync: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.home, "h", "a")); string(b) != "y" {
		t.Fatalf("h/a = %q", b)
	}
}

// TestBatchRefusesLinksAndBadNames: planted links are never followed, bad
// names are refused with the entry named, and nothing lands outside.
func TestBatchRefusesLinksAndBadNames(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	outside := filepath.Join(e.dir, "outside")
	mustMkdir(t, outside)
	writeFile(t, filepath.Join(outside, "victim"), "intact")
	root := filepath.Join(e.home, "w")
	mustMkdir(t, root)
	if err := os.Symlink(outside, filepath.Join(root, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(root, "filelink")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		ent   tarEntry
		inErr string
	}{
		{"through a dir link", tarEntry{name: "dirlink/victim", body: "pwned"}, `"dirlink/victim"`},
		{"dir entry on a link", tarEntry{name: "dirlink/", typ: tar.TypeDir}, `"dirlink"`},
		{"dotdot", tarEntry{name: "../../outside/victim", body: "pwned"}, `".."`},
		{"absolute", tarEntry{name: "/etc/passwd", body: "pwned"}, "absolute"},
		{"unclean", tarEntry{name: "a//b", body: "x"}, "a//b"},
		{"symlink entry", tarEntry{name: "new", typ: tar.TypeSymlink, link: "/"}, `"new": type "2" refused`},
		{"hard link entry", tarEntry{name: "hl", typ: tar.TypeLink, link: "filelink"}, `"hl"`},
		{"long component", tarEntry{name: strings.Repeat("x", 256), body: "x"}, "longer than 255"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.WriteBatch(ctx, "w", "", nil, tarOf(t, tt.ent))
			if errs.KindOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), tt.inErr) {
				t.Fatalf("err = %v (%v), want InvalidArgument naming %s", err, errs.KindOf(err), tt.inErr)
			}
		})
	}
	// A final link is replaced by the file, not written through.
	if _, err := e.client.WriteBatch(ctx, "w", "", nil, tarOf(t, tarEntry{name: "filelink", body: "mine"})); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "filelink")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("filelink after the batch: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "intact" {
		t.Fatalf("victim = %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("files appeared outside: %v", ents)
	}
	// A truncated tar is an error, not a short success.
	full := tarOf(t, tarEntry{name: "big", body: strings.Repeat("z", 10000)}).Bytes()
	if _, err := e.client.WriteBatch(ctx, "w", "", nil, bytes.NewReader(full[:3000])); errs.KindOf(err) != errs.InvalidArgument {
		t.Fatalf("truncated tar: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a truncated entry took its name: %v", err)
	}
	// The read side refuses a file as the directory.
	if _, err := e.client.ReadBatch(ctx, "w/filelink", ""); errs.KindOf(err) != errs.InvalidArgument {
		t.Fatalf("read batch of a file: %v", err)
	}
	_ = agentapi.MaxBatchEntries
}

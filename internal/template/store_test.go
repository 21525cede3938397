package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requireHost fails in CI (CI=true) and skips elsewhere when a prerequisite
// is missing: the suite must not pass having run nothing.
func requireHost(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing: %s (CI=true: failing instead of skipping; run scripts/setup.sh)", what)
	}
	t.Skipf("prerequisite missing: %s", what)
}

func requireRoot(t *testing.T) { t.Helper(); requireHost(t, os.Geteuid() == 0, "root") }

type entry struct {
	hdr  tar.Header
	body string
}

func mkTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func dir(name string, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}
func file(name, body string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, body: body}
}
func symlink(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target}}
}
func hardlink(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCleanEntryName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "etc/passwd", want: "etc/passwd"},
		{in: "./etc/passwd", want: "etc/passwd"},
		{in: "/etc/passwd", want: "etc/passwd"},
		{in: "./", want: "."},
		{in: ".", want: "."},
		{in: "usr//bin/", want: "usr/bin"},
		{in: "../x", bad: true},
		{in: "a/../../x", bad: true},
		{in: "a/../b", bad: true},
		{in: "..", bad: true},
		{in: "a..b", want: "a..b"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := cleanEntryName(tc.in)
			if tc.bad {
				if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != "archive" {
					t.Fatalf("cleanEntryName(%q) = %q, %v; want InvalidArgument on field archive", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("cleanEntryName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestImportTarPreservesMetadata(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	mtime := time.Unix(1600000000, 0)
	setuid := file("usr/bin/su", "#!/bin/sh\n")
	setuid.hdr.Mode = 0o4755
	owned := file("home/user/.profile", "x=1\n")
	owned.hdr.Uid, owned.hdr.Gid = 1000, 1000
	owned.hdr.ModTime = mtime
	capped := file("usr/bin/ping", "elf")
	capped.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}
	capped.hdr.Format = tar.FormatPAX
	dev := entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3}}
	fifo := entry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo"}}
	data := mkTar(t,
		dir("./", 0o755),
		dir("tmp/", 0o1777),
		dir("ro/", 0o555), file("ro/inside", "written after its read-only parent"),
		dir("usr/bin/", 0o755), setuid, owned, capped,
		symlink("bin", "usr/bin"),
		symlink("etc/alternatives/sh", "/usr/bin/su"), // absolute symlinks may exist; they are not followed
		hardlink("usr/bin/su-link", "usr/bin/su"),
		file("replaced", "first"), file("replaced", "second"),
		dev, fifo,
	)
	l, err := s.ImportTar(context.Background(), bytes.NewReader(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Path != s.LayerPath(l.Digest) || !s.HasLayer(l.Digest) || l.Skipped != 2 || l.TarSize != int64(len(data)) {
		t.Fatalf("layer = %+v", l)
	}
	root := l.Path
	mode := func(p string) os.FileMode {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode()
	}
	if got := mode("tmp"); got != os.ModeDir|os.ModeSticky|0o777 {
		t.Errorf("tmp mode = %v", got)
	}
	if got := mode("ro"); got != os.ModeDir|0o555 {
		t.Errorf("ro mode = %v", got)
	}
	if got := mode("usr/bin/su"); got != os.ModeSetuid|0o755 {
		t.Errorf("su mode = %v", got)
	}
	if got, _ := os.Readlink(filepath.Join(root, "etc/alternatives/sh")); got != "/usr/bin/su" {
		t.Errorf("symlink target = %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "bin/su")); string(b) != "#!/bin/sh\n" {
		t.Errorf("relative symlink: bin/su = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "replaced")); string(b) != "second" {
		t.Errorf("later entry must win: %q", b)
	}
	fi, _ := os.Lstat(filepath.Join(root, "home/user/.profile"))
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1000 || st.Gid != 1000 || !fi.ModTime().Equal(mtime) {
		t.Errorf(".profile uid=%d gid=%d mtime=%v", st.Uid, st.Gid, fi.ModTime())
	}
	a, _ := os.Lstat(filepath.Join(root, "usr/bin/su"))
	b, _ := os.Lstat(filepath.Join(root, "usr/bin/su-link"))
	if !os.SameFile(a, b) {
		t.Errorf("hard link not preserved")
	}
	if v, err := lgetxattr(filepath.Join(root, "usr/bin/ping"), "security.capability"); err != nil || len(v) != 20 {
		t.Errorf("capability xattr = %q, %v", v, err)
	}
	for _, p := range []string{"dev/null", "run/fifo"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s: special files must be skipped, got %v", p, err)
		}
	}
	got, err := s.ListLayers()
	if err != nil {
		t.Fatal(err)
	}
	l.CreatedAt = got[0].CreatedAt
	if diff := cmp.Diff([]Layer{l}, got); diff != "" {
		t.Errorf("ListLayers (-want +got):\n%s", diff)
	}
}

func TestImportTarRefusesEscapes(t *testing.T) {
	outside := t.TempDir() // stands in for the host filesystem
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"dotdot file", []entry{file("../escape", "x")}},
		{"dotdot inside", []entry{dir("a/", 0o755), file("a/../../escape", "x")}},
		{"absolute symlink then file through it", []entry{symlink("evil", outside), file("evil/victim", "pwned")}},
		{"absolute symlink then dir through it", []entry{symlink("evil", outside), dir("evil/sub/", 0o755)}},
		{"relative escaping symlink then file", []entry{symlink("up", "../../../../../../../.."+outside), file("up/victim", "pwned")}},
		{"nested symlink chain", []entry{dir("a/", 0o755), symlink("a/b", ".."), symlink("a/c", "b/.."), file("a/c/victim", "pwned")}},
		{"hardlink target escapes", []entry{hardlink("passwd", "../../../../../etc/passwd")}},
		{"hardlink through absolute symlink", []entry{symlink("evil", outside), hardlink("stolen", "evil/victim")}},
		{"root replaced by a file", []entry{file("x", "keep"), file(".", "")}},
		{"root replaced by a symlink", []entry{symlink(".", outside)}},
		{"symlink to parent then overwrite", []entry{symlink("etc", outside), file("etc/victim", "pwned")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			_, err := s.ImportTar(context.Background(), bytes.NewReader(mkTar(t, tc.entries...)), nil)
			if !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != "archive" {
				t.Fatalf("ImportTar = %v (kind %v); want InvalidArgument naming field archive", err, errs.KindOf(err))
			}
			if testing.Verbose() {
				t.Log(err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "untouched" {
				t.Fatalf("file outside the root was written: %q", b)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Fatalf("entries created outside the root: %v", ents)
			}
			left, _ := os.ReadDir(s.Dir())
			if len(left) != 0 {
				t.Fatalf("failed import left %v in the layer dir", left)
			}
		})
	}
	// The hard link above targets a host path that exists on every Linux
	// host; make sure nothing was linked to it.
	if _, err := os.Lstat(filepath.Join(outside, "passwd")); !os.IsNotExist(err) {
		t.Fatal("hard link escaped")
	}
}

func TestImportTarIsIdempotent(t *testing.T) {
	s := openStore(t)
	data := mkTar(t, dir("./", 0o755), dir("etc/", 0o755), file("etc/os-release", "ID=test\n"))
	ctx := context.Background()
	first, err := s.ImportTar(ctx, bytes.NewReader(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.ImportTar(ctx, bytes.NewReader(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(data)
	zw.Close()
	var progressed []Progress
	third, err := s.ImportTar(ctx, &gz, func(p Progress) { progressed = append(progressed, p) })
	if err != nil {
		t.Fatal(err)
	}
	if first.Digest != second.Digest || first.Digest != third.Digest {
		t.Fatalf("digests differ: %s %s %s", first.Digest, second.Digest, third.Digest)
	}
	// Concurrent imports of the same content race to the rename; one wins,
	// the others return the same layer.
	var wg sync.WaitGroup
	digests := make([]string, 4)
	errsOut := make([]error, 4)
	other := mkTar(t, file("hello", "world"))
	for i := range digests {
		wg.Go(func() {
			l, err := s.ImportTar(ctx, bytes.NewReader(other), nil)
			digests[i], errsOut[i] = l.Digest, err
		})
	}
	wg.Wait()
	for i := range digests {
		if errsOut[i] != nil || digests[i] != digests[0] {
			t.Fatalf("concurrent import %d: %s, %v (want %s)", i, digests[i], errsOut[i], digests[0])
		}
	}
	layers, err := s.ListLayers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("want 2 layers, got %+v", layers)
	}
	ents, _ := os.ReadDir(s.Dir())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

func TestRemoveLayer(t *testing.T) {
	s := openStore(t)
	l, err := s.ImportTar(context.Background(), bytes.NewReader(mkTar(t, file("a", "b"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveLayer(l.Digest); err != nil {
		t.Fatal(err)
	}
	if s.HasLayer(l.Digest) {
		t.Fatal("layer still there")
	}
	if err := s.RemoveLayer(l.Digest); !errs.Is(err, errs.NotFound) {
		t.Fatalf("second remove = %v, want NotFound", err)
	}
	if err := s.RemoveLayer("../../etc"); !errs.Is(err, errs.InvalidArgument) || errs.FieldOf(err) != "digest" {
		t.Fatalf("bad digest = %v, want InvalidArgument on digest", err)
	}
	if _, err := s.Layer(strings.Repeat("a", 64)); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Layer(missing) = %v", err)
	}
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 0 {
		t.Fatalf("remove left %v", ents)
	}
}

func TestOpenRemovesInterruptedImports(t *testing.T) {
	data := t.TempDir()
	stale := filepath.Join(data, "layers", tmpPrefix+"123", "etc")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(data, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(stale)); !os.IsNotExist(err) {
		t.Fatalf("stale import dir survives: %v", err)
	}
	if _, err := Open("", nil); errs.FieldOf(err) != "data_dir" {
		t.Fatalf("Open(\"\") = %v, want field data_dir", err)
	}
}

func TestImportTarRejectsGarbage(t *testing.T) {
	s := openStore(t)
	_, err := s.ImportTar(context.Background(), strings.NewReader(strings.Repeat("not a tar ", 100)), nil)
	if !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("garbage = %v, want InvalidArgument", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.ImportTar(ctx, bytes.NewReader(mkTar(t, file("a", "b"))), nil); err == nil {
		t.Fatal("cancelled import succeeded")
	}
}

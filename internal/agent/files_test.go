package agent_test

import (
	"bytes"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func ownerOf(t *testing.T, p string) [2]uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]uint32{st.Uid, st.Gid}
}

func readAll(t *testing.T, c *agentapi.Client, path, user string) ([]byte, int64) {
	t.Helper()
	rc, n, err := c.ReadFile(testCtx(t), path, user)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, n
}

func TestFilesRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	every := make([]byte, 0, 512)
	for i := range 512 {
		every = append(every, byte(i))
	}
	tests := []struct {
		name     string
		path     string
		user     string
		data     []byte
		wantPath string
		owner    [2]uint32
	}{
		{"all byte values", "bytes.bin", "", every, filepath.Join(e.home, "bytes.bin"), [2]uint32{nobody, nobody}},
		{"empty file", "~/empty", "", nil, filepath.Join(e.home, "empty"), [2]uint32{nobody, nobody}},
		{"nested parents", "a/b/c/d.txt", "", []byte("deep"), filepath.Join(e.home, "a/b/c/d.txt"), [2]uint32{nobody, nobody}},
		{"as root", filepath.Join(e.dir, "rootfile"), "root", []byte("r"), filepath.Join(e.dir, "rootfile"), [2]uint32{0, 0}},
		{"overwrite", "bytes.bin", "", []byte("short"), filepath.Join(e.home, "bytes.bin"), [2]uint32{nobody, nobody}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := e.client.WriteFile(ctx, tt.path, tt.user, 0, bytes.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			want := agentapi.EntryInfo{Name: filepath.Base(tt.wantPath), Type: "file", Path: tt.wantPath,
				Size: int64(len(tt.data)), Mode: 0o644, Permissions: "-rw-r--r--"}
			if d := cmp.Diff(want, info, cmpopts.IgnoreFields(agentapi.EntryInfo{}, "Owner", "Group", "ModTime")); d != "" {
				t.Fatalf("entry (-want +got):\n%s", d)
			}
			got, n := readAll(t, e.client, tt.path, tt.user)
			if !bytes.Equal(got, tt.data) || n != int64(len(tt.data)) {
				t.Fatalf("read back %d bytes (Content-Length %d), want %d", len(got), n, len(tt.data))
			}
			if o := ownerOf(t, tt.wantPath); o != tt.owner {
				t.Fatalf("owner = %v, want %v", o, tt.owner)
			}
		})
	}
	for _, dir := range []string{"a", "a/b", "a/b/c"} {
		if o := ownerOf(t, filepath.Join(e.home, dir)); o != [2]uint32{nobody, nobody} {
			t.Errorf("created parent %s owner = %v", dir, o)
		}
	}
	entries, err := os.ReadDir(e.home)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		if strings.Contains(de.Name(), ".berth-") {
			t.Errorf("temp file left behind: %s", de.Name())
		}
	}
}

func TestFilesModeAndErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	info, err := e.client.WriteFile(ctx, "run.sh", "", 0o755, strings.NewReader("#!/bin/sh\necho ran\n"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != 0o755 || info.Permissions != "-rwxr-xr-x" || info.Owner != "user" || info.Group != "nogroup" {
		t.Fatalf("entry = %+v", info)
	}
	if got := e.run(agentapi.ExecRequest{Argv: []string{"./run.sh"}}); got.Stdout != "ran\n" {
		t.Fatalf("run written script: %+v", got)
	}
	writeFile(t, filepath.Join(e.home, "afile"), "x")
	tests := []struct {
		name  string
		err   func() error
		kind  errs.Kind
		words string
	}{
		{"read missing", func() error { _, _, err := e.client.ReadFile(ctx, "nope", ""); return err }, errs.NotFound, "nope"},
		{"read directory", func() error { _, _, err := e.client.ReadFile(ctx, "~", ""); return err }, errs.InvalidArgument, "directory"},
		{"read unknown user", func() error { _, _, err := e.client.ReadFile(ctx, "x", "mallory"); return err }, errs.Unauthenticated, "unknown user"},
		{"write onto directory", func() error {
			_, err := e.client.WriteFile(ctx, "~", "", 0, strings.NewReader("x"))
			return err
		}, errs.InvalidArgument, "directory"},
		{"write under a file", func() error {
			_, err := e.client.WriteFile(ctx, "afile/x", "", 0, strings.NewReader("x"))
			return err
		}, errs.InvalidArgument, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantErr(t, tt.err(), tt.kind, tt.words) })
	}
}

// TestFilesLarge streams 64 MiB each way without holding it in memory twice.
func TestFilesLarge(t *testing.T) {
	e := newEnv(t)
	const size = 64 << 20
	src := io.LimitReader(newPattern(), size)
	h := sha256.New()
	info, err := e.client.WriteFile(testCtx(t), "large.bin", "", 0, io.TeeReader(src, h))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != size {
		t.Fatalf("size = %d", info.Size)
	}
	want := h.Sum(nil)
	rc, n, err := e.client.ReadFile(testCtx(t), "large.bin", "")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h.Reset()
	if got, err := io.Copy(h, rc); err != nil || got != size || n != size {
		t.Fatalf("read %d bytes (Content-Length %d): %v", got, n, err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		t.Fatal("64 MiB file differs after round trip")
	}
}

// pattern is an endless, non-repeating-per-block byte stream.
type pattern struct{ n uint64 }

func newPattern() *pattern { return &pattern{n: 0x9e3779b97f4a7c15} }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		p.n ^= p.n << 13
		p.n ^= p.n >> 7
		p.n ^= p.n << 17
		b[i] = byte(p.n)
	}
	return len(b), nil
}

// TestFilesNoSpace fills a tiny tmpfs: the agent must say so by kind.
func TestFilesNoSpace(t *testing.T) {
	e := newEnv(t)
	testutil.RequireTool(t, "mount")
	mnt := filepath.Join(e.dir, "small")
	mustMkdir(t, mnt)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt).CombinedOutput(); err != nil {
		testutil.Missing(t, "mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	_, err := e.client.WriteFile(testCtx(t), filepath.Join(mnt, "full"), "root", 0, io.LimitReader(newPattern(), 1<<20))
	wantErr(t, err, errs.ResourceExhausted, "no space left on device")
	left, err := os.ReadDir(mnt)
	if err != nil || len(left) != 0 {
		t.Fatalf("after ENOSPC the mount holds %v (%v)", left, err)
	}
}

package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/testutil"
)

func testChannels(t *testing.T) (*channels, string) {
	t.Helper()
	// A short base: the socket path must fit in sun_path.
	base, err := os.MkdirTemp("", "chan")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	c := newChannels(make([]byte, agentapi.KeySize), func(id string) string { return filepath.Join(base, id) },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(c.closeAll)
	return c, base
}

// tmpfsChannels is testChannels with channel dirs on tmpfs, as the daemon
// has them (mounting needs root).
func tmpfsChannels(t *testing.T) (*channels, string) {
	t.Helper()
	testutil.RequireRoot(t)
	c, base := testChannels(t)
	c.tmpfs = true
	return c, base
}

// TestChannels: the registry keeps one listener per sandbox; open replaces
// it, drop removes it, get listens again only for a sandbox whose directory
// exists, and closeAll leaves no goroutine behind.
func TestChannels(t *testing.T) {
	defer goleak.VerifyNone(t)
	c, base := testChannels(t)
	a, err := c.open("a")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.get("a"); err != nil || got != a {
		t.Fatalf("get after open: %p %v, want %p", got, err, a)
	}
	fi, err := os.Stat(filepath.Join(base, "a", "chan"))
	if err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("channel dir: %v %v, want mode 0711", fi, err)
	}
	a2, err := c.open("a")
	if err != nil || a2 == a {
		t.Fatalf("open again: %p %v: want a new listener", a2, err)
	}
	c.drop("a")
	again, err := c.get("a") // the daemon restarted or dropped it: listen again
	if err != nil || again == a2 {
		t.Fatalf("get after drop: %p %v", again, err)
	}
	if _, err := c.get("gone"); !errs.Is(err, errs.Unavailable) {
		t.Errorf("get of a sandbox without a directory: %v, want Unavailable", err)
	}
	if _, err := os.Stat(filepath.Join(base, "gone")); !os.IsNotExist(err) {
		t.Errorf("get recreated the directory of a sandbox that is gone: %v", err)
	}
	if cl := c.client("gone"); cl == nil {
		t.Errorf("client of a gone sandbox is nil, want an unreachable client")
	}
	c.closeAll()
	if len(c.m) != 0 {
		t.Errorf("closeAll left %d channels", len(c.m))
	}
}

// TestChannelDirRefusesALink: a channel directory replaced by a symlink is
// refused, never followed.
func TestChannelDirRefusesALink(t *testing.T) {
	c, base := testChannels(t)
	target := t.TempDir()
	if err := os.MkdirAll(filepath.Join(base, "b"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(base, "b", "chan")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.open("b"); err == nil {
		t.Fatal("open over a symlinked channel dir succeeded")
	}
	if err := c.writeEnv(&sandbox.Sandbox{ID: "b", Env: map[string]string{"K": "v"}}); err == nil {
		t.Fatal("writeEnv through a symlinked channel dir succeeded")
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("files landed in the link's target: %v", ents)
	}
}

// TestWriteEnv: env.json holds the sandbox's environment, readable by an
// unprivileged sandbox root, and a link planted at its temp name is
// replaced, not followed.
func TestWriteEnv(t *testing.T) {
	c, _ := testChannels(t)
	sb := &sandbox.Sandbox{ID: "e", Env: map[string]string{"A": "1", "B": "two"}}
	if err := c.ensureDir(sb.ID); err != nil {
		t.Fatal(err)
	}
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(canary, filepath.Join(c.dir(sb.ID), "env.json.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := c.writeEnv(sb); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(canary); string(b) != "host" {
		t.Errorf("the canary behind a planted link was written: %q", b)
	}
	p := filepath.Join(c.dir(sb.ID), "env.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(b, &got); err != nil || got["A"] != "1" || got["B"] != "two" || len(got) != 2 {
		t.Errorf("env.json = %s (%v)", b, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("env.json mode %v, want 0644", fi.Mode().Perm())
	}
}

// TestWriteFileReplaces: each write replaces the file whole with another
// inode than the one it replaces (the agent's cache relies on it), leaves
// no other name in the channel dir, and a reader holding the old file
// keeps reading its content.
func TestWriteFileReplaces(t *testing.T) {
	c, _ := testChannels(t)
	if err := c.ensureDir("r"); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(c.dir("r"), "leases.env")
	var inodes []uint64
	var held *os.File
	for i := range 5 {
		if err := c.writeFile("r", "leases.env", []byte(fmt.Sprintf("V=%d\n", i))); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			held = f
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		// The new inode is made while the one it replaces exists, so it
		// differs from it; freed inodes of earlier writes may come back.
		if n := len(inodes); n > 0 && inodes[n-1] == st.Ino {
			t.Errorf("write %d kept inode %d of the file it replaced", i, st.Ino)
		}
		inodes = append(inodes, st.Ino)
	}
	if b, _ := os.ReadFile(p); string(b) != "V=4\n" {
		t.Errorf("leases.env = %q, want V=4", b)
	}
	if b, _ := io.ReadAll(held); string(b) != "V=0\n" {
		t.Errorf("the first file, held open, reads %q", b)
	}
	entries, err := os.ReadDir(c.dir("r"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "leases.env.") {
			t.Errorf("left in the channel dir: %s", e.Name())
		}
	}
}

// TestChannelDirTmpfs: with the real filesystem a new channel dir is a
// tmpfs of its own (nosuid, nodev, 0711), its files are written there and
// a listener works on it; a channel dir that already existed (a sandbox
// started before, whose bind mount holds that dir) is left as it is; and
// removeSandboxDir takes the mount with the directory.
func TestChannelDirTmpfs(t *testing.T) {
	c, base := tmpfsChannels(t)
	t.Cleanup(func() {
		for _, id := range []string{"n", "o"} {
			_ = unix.Unmount(filepath.Join(base, id, "chan"), unix.MNT_DETACH)
		}
	})
	if err := c.ensureDir("n"); err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(c.dir("n"), &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("new channel dir is on fs type %#x, not a tmpfs", fs.Type)
	}
	if fs.Flags&unix.ST_NOSUID == 0 || fs.Flags&unix.ST_NODEV == 0 {
		t.Errorf("channel tmpfs flags %#x lack nosuid or nodev", fs.Flags)
	}
	if fi, _ := os.Stat(c.dir("n")); fi.Mode().Perm() != 0o711 {
		t.Errorf("channel tmpfs mode %v, want 0711", fi.Mode().Perm())
	}
	if err := c.writeFile("n", "leases.env", []byte("A=1\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.open("n"); err != nil {
		t.Fatalf("listen on the tmpfs: %v", err)
	}
	c.drop("n")

	// A dir made before (plain, holding a socket a running sandbox uses).
	old := filepath.Join(base, "o", "chan")
	if err := os.MkdirAll(old, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, "env.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.ensureDir("o"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(old, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Fatalf("an existing channel dir was mounted over (%v)", err)
	}

	for _, id := range []string{"n", "o"} {
		if err := removeSandboxDir(filepath.Join(base, id)); err != nil {
			t.Fatalf("removeSandboxDir %s: %v", id, err)
		}
		if _, err := os.Lstat(filepath.Join(base, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox dir %s left: %v", id, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), base+"/") {
		t.Errorf("a mount under %s is left", base)
	}
}

// TestRemovingSandboxDirIsNotUndone: once a sandbox's directory is being
// removed, nothing remakes its channel dir or listener: not the reaper's
// lookup of an agent (get), not a lease or env write. Here the removal
// fails half way (a mount point inside it), which keeps the sandbox marked
// until a later removal succeeds.
func TestRemovingSandboxDirIsNotUndone(t *testing.T) {
	c, base := tmpfsChannels(t)
	if _, err := c.open("r"); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(base, "r", "zz-mount")
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", blocker, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(blocker, unix.MNT_DETACH)
		_ = unix.Unmount(c.dir("r"), unix.MNT_DETACH)
	})
	if err := c.removeSandboxDir("r"); err == nil {
		t.Fatal("removing a directory holding a mount point succeeded")
	}
	if _, err := os.Lstat(c.dir("r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("channel dir after the failed removal: %v, want it removed", err)
	}
	if _, err := c.get("r"); errs.KindOf(err) != errs.Unavailable {
		t.Errorf("get during the removal: %v, want Unavailable", err)
	}
	if err := c.writeFile("r", "leases.env", []byte("A=1\n")); errs.KindOf(err) != errs.Unavailable {
		t.Errorf("writeFile during the removal: %v, want Unavailable", err)
	}
	if _, err := os.Lstat(c.dir("r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("channel dir remade during the removal: %v", err)
	}
	if err := unix.Unmount(blocker, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.removeSandboxDir("r"); err != nil {
		t.Fatalf("second removal: %v", err)
	}
	if _, err := c.get("r"); err == nil {
		t.Error("get after the removal listened again")
	}
	if _, err := os.Lstat(filepath.Join(base, "r")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sandbox dir after the removal: %v, want none", err)
	}
}

// TestSharedChannelTmpfs: new channel dirs are directories on one tmpfs
// (DATA/chan), not a mount each; a sandbox whose dir was made before
// keeps it; a second daemon reuses the mount; the last removal and a
// shutdown leave nothing mounted.
func TestSharedChannelTmpfs(t *testing.T) {
	c, base := tmpfsChannels(t)
	shared := filepath.Join(base, "chan-shared")
	t.Cleanup(func() { _ = unix.Unmount(shared, unix.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Join(base, "old", "chan"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := c.useShared(shared, base); err != nil {
		t.Fatal(err)
	}
	mounts := func() int {
		ms, err := testutil.MountsUnder(base)
		if err != nil {
			t.Fatal(err)
		}
		return len(ms)
	}
	if n := mounts(); n != 1 {
		t.Fatalf("%d mounts under the data dir after useShared, want the shared tmpfs alone", n)
	}
	if _, err := c.open("n"); err != nil {
		t.Fatal(err)
	}
	if got, want := c.socketPath("n"), filepath.Join(shared, "n", agentapi.SocketName); got != want {
		t.Errorf("socket of a new sandbox at %s, want %s", got, want)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(c.dir("n"), &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("new channel dir not on a tmpfs: %#x %v", fs.Type, err)
	}
	if fi, err := os.Stat(c.dir("n")); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("new channel dir: %v %v, want mode 0711", fi, err)
	}
	if n := mounts(); n != 1 {
		t.Errorf("%d mounts after a new channel dir, want 1: a dir on the shared tmpfs is no mount", n)
	}
	if got, want := c.dir("old"), filepath.Join(base, "old", "chan"); got != want {
		t.Errorf("a sandbox made before keeps its own dir: %s, want %s", got, want)
	}
	// A second daemon on the same data dir (a restart) finds the mount.
	c2 := newChannels(c.key, c.sandboxDir, c.log)
	c2.tmpfs = true
	if err := c2.useShared(shared, base); err != nil {
		t.Fatal(err)
	}
	if n := mounts(); n != 1 {
		t.Errorf("%d mounts after a second useShared, want 1", n)
	}
	c2.releaseShared() // n's dir is there: the mount stays
	if n := mounts(); n != 1 {
		t.Fatalf("releaseShared unmounted a tmpfs holding a sandbox's channel dir")
	}
	if err := c.removeSandboxDir("n"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(shared, "n")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("channel dir after the removal: %v", err)
	}
	c.releaseShared()
	if n := mounts(); n != 0 {
		t.Errorf("%d mounts after the last removal and a shutdown, want 0", n)
	}
}

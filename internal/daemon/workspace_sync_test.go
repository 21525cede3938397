package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestSyncWorkspace: the host barrier syncs a mounted workspace and refuses
// everything else: no mount at ws, a symbolic link at ws or at the sandbox
// directory (even one pointing at a real mount), an id that is no id.
func TestSyncWorkspace(t *testing.T) {
	testutil.RequireRoot(t)
	data := t.TempDir()
	d := &Daemon{cfg: Config{DataDir: data}}
	mkdir := func(p string) {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// ok: a tmpfs mounted at sandboxes/ok/ws.
	ws := filepath.Join(data, "sandboxes", "ok", "ws")
	mkdir(ws)
	if err := unix.Mount("tmpfs", ws, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ws, unix.MNT_DETACH) })
	if !d.WorkspaceBarrier("ok") {
		t.Fatal("no barrier for a mounted workspace")
	}
	if _, err := d.SyncWorkspace("ok"); err != nil {
		t.Fatal(err)
	}
	// plain: ws is a directory, not a mount.
	mkdir(filepath.Join(data, "sandboxes", "plain", "ws"))
	// wslink: ws is a link to the mounted one; dirlink: the sandbox
	// directory is a link to ok's.
	mkdir(filepath.Join(data, "sandboxes", "wslink"))
	if err := os.Symlink(ws, filepath.Join(data, "sandboxes", "wslink", "ws")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(data, "sandboxes", "ok"), filepath.Join(data, "sandboxes", "dirlink")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"plain", "wslink", "dirlink", "missing", "../sandboxes/ok", "", "OK"} {
		if d.WorkspaceBarrier(id) {
			t.Errorf("%q: a barrier was offered", id)
		}
		if _, err := d.SyncWorkspace(id); err == nil {
			t.Errorf("%q: synced", id)
		}
	}
}

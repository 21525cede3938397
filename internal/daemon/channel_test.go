package daemon

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
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

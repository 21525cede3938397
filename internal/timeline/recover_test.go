package timeline

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// recoverCore is the little of Core that Recover uses; any other call panics
// (the embedded interface is nil).
type recoverCore struct {
	Core
	dir    string
	events []string
}

func (c *recoverCore) SandboxDir(string) string { return c.dir }
func (c *recoverCore) Event(_ context.Context, _ *sandbox.Sandbox, _, _, reason, _ string, data map[string]string) {
	c.events = append(c.events, reason+" committed="+data["committed"])
}

// TestRecover: a restart interrupted before its layer switch gets its old
// workspace back; one interrupted after it drops the old workspace (the
// sandbox boots on the new layers, as the restart would have).
func TestRecover(t *testing.T) {
	old, nu := []string{"t1"}, []string{"d2", "d1", "t1"}
	for _, tc := range []struct {
		name      string
		journal   bool
		layers    []string
		aside     bool
		image     bool   // a fresh image the restart had begun
		wantImage string // content of disk.img afterwards ("" = none)
		wantEvent bool
	}{
		{"nothing to settle", false, old, false, true, "fresh", false},
		{"crash after the image moved, before the layer switch", true, old, true, false, "old", true},
		{"crash during the new start, before the switch", true, old, true, true, "old", true},
		{"crash after the switch", true, nu, true, true, "fresh", true},
		{"aside without journal", false, old, true, false, "old", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := rootfs.LayoutOf(dir)
			if tc.journal {
				if err := writeJournal(dir, restartJournal{Old: old, New: nu}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.aside {
				if err := os.WriteFile(l.Image+".timeline", []byte("old"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.image {
				if err := os.WriteFile(l.Image, []byte("fresh"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			c := &recoverCore{dir: dir}
			s := New(c, Config{DataDir: t.TempDir()}, nil)
			sb := &sandbox.Sandbox{ID: "sb1", Attrs: sandbox.Attrs{Layers: tc.layers}}
			if err := s.Recover(t.Context(), sb, ""); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(l.Image)
			if string(got) != tc.wantImage {
				t.Errorf("disk.img = %q, want %q", got, tc.wantImage)
			}
			for _, p := range []string{l.Image + ".timeline", journalPath(dir)} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s left: %v", filepath.Base(p), err)
				}
			}
			if (len(c.events) > 0) != tc.wantEvent {
				t.Errorf("events %v, want an event: %v", c.events, tc.wantEvent)
			}
		})
	}
}

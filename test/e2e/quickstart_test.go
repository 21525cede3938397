package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickstart runs test/quickstart.sh — the README quickstart — against a
// real server that imports the default template itself (from the set-up's
// cache, as `scripts/setup.sh` does) and uses the default runtime.
func TestQuickstart(t *testing.T) {
	tars, _ := filepath.Glob("/var/cache/berth/rootfs/default-*.tar")
	if len(tars) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("no default template in /var/cache/berth/rootfs (scripts/setup.sh builds it)")
		}
		t.Skip("no default template in /var/cache/berth/rootfs")
	}
	script, err := filepath.Abs("../quickstart.sh")
	if err != nil {
		t.Fatal(err)
	}
	// As installed, and as on a host where CRIU hangs (the script then sees
	// a recorded disk pause, promptly).
	for _, c := range []string{"installed", "criu-hangs"} {
		t.Run(c, func(t *testing.T) {
			if c == "criu-hangs" {
				criu, _ := fakeCRIU(t, "hang")
				t.Setenv("BERTH_CRIU", criu) // a stand-in of its own: no cached verdict applies
			}
			s := startServer(t, "--no-default-template=false")
			rpWaitFor(t, 5*time.Minute, "template default to be ready", func() bool {
				out, _ := s.run("template", "ls")
				return containsLine(out, "default", "ready")
			})
			cmd := exec.Command("sh", script)
			cmd.Env = append(s.env(s.key), "BERTH="+filepath.Join(s.bin, "berth"))
			out, err := cmd.CombinedOutput()
			t.Logf("quickstart.sh:\n%s", out)
			if err != nil {
				t.Fatalf("quickstart.sh: %v", err)
			}
			// A workstation without --runtime lives through pauses: it gets
			// runsc when runc cannot take memory checkpoints here and runsc can.
			want := "runc"
			if !checkpointCaps(t, s, "runc").Checkpoint && checkpointCaps(t, s, "runsc").Checkpoint {
				want = "runsc"
			}
			w := s.create("--workstation")
			var sb struct {
				Runtime string `json:"runtime"`
			}
			if err := json.Unmarshal([]byte(s.must("inspect", w)), &sb); err != nil {
				t.Fatal(err)
			}
			if sb.Runtime != want {
				t.Errorf("workstation runtime %q, want %q", sb.Runtime, want)
			}
			s.must("rm", w)
		})
	}
}

// containsLine reports whether some line of out has every word as a field.
func containsLine(out string, words ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && !slices.ContainsFunc(words, func(w string) bool { return !slices.Contains(f, w) }) {
			return true
		}
	}
	return false
}

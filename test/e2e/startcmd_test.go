package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestTemplateStartCommand: a template's CMD runs in the background on
// create and again after a disk pause (a cold boot), not after a memory
// or freeze resume (its processes continued).
func TestTemplateStartCommand(t *testing.T) {
	s := startServer(t)
	ctxDir := t.TempDir()
	df := "FROM tiny\nUSER user\nWORKDIR /home/user\nCMD [\"sh\", \"-c\", \"echo boot >> boots; pwd > where; exec sleep 100000\"]\n"
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := s.run("template", "build", "-t", "svc", ctxDir); code != 0 {
		t.Fatalf("build: %s", out)
	}
	id := s.must("create", "--template", "svc")
	boots := func(want int) {
		t.Helper()
		testutil.Eventually(t, testutil.Within(10*time.Second).Every(100*time.Millisecond), func() error {
			out, _ := s.run("exec", id, "--", "cat", "/home/user/boots")
			if n := strings.Count(out, "boot"); n != want {
				return fmt.Errorf("start command ran %d times, want %d (%q)", n, want, out)
			}
			return nil
		})
	}
	boots(1)
	if out := s.must("exec", id, "--", "cat", "/home/user/where"); out != "/home/user" {
		t.Fatalf("start command ran in %q, want the template's WORKDIR", out)
	}
	if out := s.must("exec", id, "--", "sh", "-c", "stat -c %U /home/user/boots"); out != "user" {
		t.Fatalf("start command ran as %q, want the template's USER", out)
	}
	s.must("pause", id, "--mode", "freeze")
	s.must("resume", id)
	boots(1)
	s.must("pause", id, "--mode", "disk")
	s.must("resume", id)
	boots(2)
	if evs := s.must("events", id, "--json"); !strings.Contains(evs, `"start_command"`) {
		t.Fatalf("no start_command event:\n%s", evs)
	}
}

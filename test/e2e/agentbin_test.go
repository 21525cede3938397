package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testutil"
)

// TestPlainGoBuildInstallation: `go build -o DIR ./cmd/...` on a host with
// a C compiler links berth-agent dynamically; the daemon must still run it
// as PID 1 in a root filesystem without a libc (the busybox template).
func TestPlainGoBuildInstallation(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "gcc")
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/...")
	build.Dir = testutil.RepoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, _ := exec.Command("file", filepath.Join(dir, "berth-agent")).Output(); len(out) > 0 && !strings.Contains(string(out), "dynamically linked") {
		t.Logf("note: this toolchain linked berth-agent statically: %s", out)
	}
	s := startServerFrom(t, dir)
	id := s.create()
	if out := s.must("exec", id, "--", "sh", "-c", "echo ok"); out != "ok" {
		t.Fatalf("exec: %q", out)
	}
}

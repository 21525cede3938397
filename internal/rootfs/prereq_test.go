package rootfs

import (
	"os"
	"os/exec"
	"testing"
)

// requireHost fails under CI (the suite must not pass having run nothing)
// and skips elsewhere when root or a tool is missing.
func requireHost(t testing.TB, tools ...string) {
	t.Helper()
	missing := ""
	if os.Geteuid() != 0 {
		missing = "root"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing += " " + tool
		}
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing prerequisite(s) in CI: %s", missing)
	}
	t.Skipf("missing prerequisite(s): %s", missing)
}

package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RemoveAllChecked removes dir, a data directory a test gave a daemon,
// unless something of the host still lives under it: a mount or a loop
// device backed by a file there (a sandbox that was never torn down). Then
// it fails t naming each one and leaves dir in place — os.RemoveAll would
// descend into the mounted workspaces and unlink their files, hiding the
// leak behind "(deleted)" entries that nothing cleans up. Call it after the
// daemon has closed.
func RemoveAllChecked(t testing.TB, dir string) {
	t.Helper()
	leaks, err := HostLeaks(dir)
	if err != nil {
		t.Errorf("check %s for leaked mounts and loop devices: %v", dir, err)
		return
	}
	if len(leaks) > 0 {
		t.Errorf("%d host resources left under %s after the daemon closed (dir kept):\n  %s",
			len(leaks), dir, strings.Join(leaks, "\n  "))
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Errorf("remove %s: %v", dir, err)
	}
}

// under reports whether p is dir or below it (both cleaned, absolute).
func under(p, dir string) bool {
	dir = filepath.Clean(dir)
	p = filepath.Clean(p)
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

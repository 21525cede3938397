package activity

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/safefs"
)

// ScanUpper reports what changed after since, never follows a symlink the
// sandbox planted (to a host directory full of files), and stops at its budget.
func TestScanUpper(t *testing.T) {
	upper, outside := t.TempDir(), t.TempDir()
	for _, f := range []string{"host-secret-1", "host-secret-2"} {
		if err := os.WriteFile(filepath.Join(outside, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite := func(rel, data string) {
		p := filepath.Join(upper, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite("home/user/old.txt", "old")
	time.Sleep(20 * time.Millisecond) // ctime granularity: the kernel's clock tick
	since := time.Now()
	time.Sleep(20 * time.Millisecond)
	mustWrite("home/user/new.txt", "hello")
	mustWrite("tmp/deep/er/file", "12345678")
	if err := os.Symlink(outside, filepath.Join(upper, "home/user/escape")); err != nil {
		t.Fatal(err)
	}
	root, err := safefs.OpenRoot(upper)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	got, truncated := ScanUpper(root, since, 1000)
	if truncated {
		t.Error("truncated with a budget of 1000")
	}
	paths := map[string]Change{}
	for _, c := range got {
		paths[c.Path] = c
		if strings.Contains(c.Path, "host-secret") {
			t.Errorf("followed the planted symlink: %+v", c)
		}
	}
	if c, ok := paths["/home/user/new.txt"]; !ok || c.Size != 5 || c.Op != "write" {
		t.Errorf("new.txt: %+v in %+v", c, got)
	}
	if c, ok := paths["/tmp/deep/er/file"]; !ok || c.Size != 8 {
		t.Errorf("deep file: %+v in %+v", c, got)
	}
	if _, ok := paths["/home/user/escape"]; !ok {
		t.Errorf("the symlink itself is a change (reported, not followed): %+v", got)
	}
	if _, ok := paths["/home/user/old.txt"]; ok {
		t.Errorf("old.txt predates since: %+v", got)
	}
	if len(got) != 3 {
		t.Errorf("changes = %+v, want 3", got)
	}

	// A sandbox with more entries than the budget: the walk stops.
	for i := range 50 {
		mustWrite(filepath.Join("spam", strings.Repeat("f", 1+i%5)+string(rune('a'+i%26))+string(rune('a'+i/26))), "")
	}
	if _, truncated := ScanUpper(root, since, 20); !truncated {
		t.Error("a 20-entry budget over 60 entries did not truncate")
	}
}

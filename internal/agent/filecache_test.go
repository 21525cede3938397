package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestVersionedCache: a settled file is read once; any change (content of
// the same size, a replacement, removal) is read again; a file changed
// within the racy window is read on every call.
func TestVersionedCache(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "passwd")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var c versionedCache[string]
	loads := 0
	load := func() (string, error) {
		loads++
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return "", nil
		}
		return string(b), err
	}
	get := func(now time.Time, want string, wantLoads int) {
		t.Helper()
		got, err := c.get(now, []string{p}, load)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || loads != wantLoads {
			t.Fatalf("got %q after %d loads, want %q after %d", got, loads, want, wantLoads)
		}
	}
	write("aaaa")
	now := time.Now()
	get(now, "aaaa", 1)
	get(now, "aaaa", 2) // just written: racy, never cached
	later := now.Add(2 * racyWindow)
	get(later, "aaaa", 3)
	get(later, "aaaa", 3) // settled: cached
	write("bbbb")         // same size, in place
	get(time.Now().Add(2*racyWindow), "bbbb", 4)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte("cccc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	get(time.Now().Add(2*racyWindow), "cccc", 5)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	get(time.Now().Add(2*racyWindow), "", 6)
	get(time.Now().Add(2*racyWindow), "", 6) // absent is a version too
}

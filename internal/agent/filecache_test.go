package agent

import (
	"os"
	"path/filepath"
	"strings"
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

// TestVersionedCacheRenamed: a file only ever replaced by rename (the
// daemon's env.json) is cached at once, inside the racy window, and each
// same-size replacement made within the same clock tick is still seen.
func TestVersionedCacheRenamed(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "env.json")
	replace := func(s string) {
		t.Helper()
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	c := versionedCache[string]{renamed: true}
	loads := 0
	load := func() (string, error) {
		loads++
		b, err := readSmallFile(p)
		return string(b), err
	}
	get := func(want string, wantLoads int) {
		t.Helper()
		got, err := c.get(time.Now(), []string{p}, load)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || loads != wantLoads {
			t.Fatalf("got %q after %d loads, want %q after %d", got, loads, want, wantLoads)
		}
	}
	replace(`{"A":"1"}`)
	get(`{"A":"1"}`, 1)
	get(`{"A":"1"}`, 1) // just written, yet cached
	for i, v := range []string{`{"A":"2"}`, `{"A":"3"}`, `{"A":"4"}`} {
		replace(v) // same size, same tick: a new inode each time
		get(v, 2+i)
		get(v, 2+i)
	}
}

// TestReadSmallFile reads files across its buffer growth and names the
// path of a missing one.
func TestReadSmallFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, 4095, 4096, 4097, 100000} {
		p := filepath.Join(dir, "f")
		want := make([]byte, n)
		for i := range want {
			want[i] = byte('a' + i%26)
		}
		if err := os.WriteFile(p, want, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := readSmallFile(p)
		if err != nil || string(got) != string(want) {
			t.Fatalf("size %d: got %d bytes, err %v", n, len(got), err)
		}
	}
	_, err := readSmallFile(filepath.Join(dir, "missing"))
	if !os.IsNotExist(err) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing file: %v", err)
	}
}

package activity

import (
	"os"
	"path/filepath"
	"slices"
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

// TestSampleSchedule: a quiet sandbox's scans drift apart, doubling up to
// sampleMaxGap; a found change, a poke (an entry recorded for it) or a
// return to running scans at the next tick and starts again at sampleEvery.
func TestSampleSchedule(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	tick := func(i int) time.Time { return t0.Add(time.Duration(i) * sampleEvery) }
	// run ticks from..to (running at each), scanning when due; busy says
	// which ticks' scans find a change, poked which ticks are poked.
	run := func(c sampleSchedule, from, to int, busy, poked map[int]bool) (sampleSchedule, []int) {
		var scans []int
		for i := from; i <= to; i++ {
			now := tick(i)
			if !c.due(now, poked[i]) {
				c.seen = now
				continue
			}
			scans = append(scans, i)
			c = c.scanned(now, now, busy[i] || poked[i])
		}
		return c, scans
	}
	c, scans := run(sampleSchedule{}, 0, 40, nil, nil)
	// Gaps 5 s, 10, 20, 40, 40, ...: ticks 0, 1, 3, 7, 15, 23, 31, 39.
	if want := []int{0, 1, 3, 7, 15, 23, 31, 39}; !slices.Equal(scans, want) {
		t.Fatalf("quiet scans at ticks %v, want %v", scans, want)
	}
	if c.gap != sampleMaxGap {
		t.Fatalf("gap after a quiet while %v, want %v", c.gap, sampleMaxGap)
	}
	// A poke at 41 scans at once and brings the gap back to a tick.
	c, scans = run(c, 40, 44, nil, map[int]bool{41: true})
	if want := []int{41, 42, 44}; !slices.Equal(scans, want) {
		t.Fatalf("after a poke at 41: scans at %v, want %v", scans, want)
	}
	// A change found keeps it at every tick.
	c, scans = run(c, 45, 52, map[int]bool{48: true, 49: true}, nil)
	if want := []int{48, 49, 50, 52}; !slices.Equal(scans, want) {
		t.Fatalf("changes at 48 and 49: scans at %v, want %v", scans, want)
	}
	// Paused from 53 to 80 (no ticks see it), back at 81: scanned at once, every tick again.
	_, scans = run(c, 81, 83, nil, nil)
	if want := []int{81, 82}; !slices.Equal(scans, want) {
		t.Fatalf("back after a pause: scans at %v, want %v", scans, want)
	}
}

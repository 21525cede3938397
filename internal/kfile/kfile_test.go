package kfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadProcAgreesWithOS: a procfs file read here is what os.ReadFile reads.
func TestReadProcAgreesWithOS(t *testing.T) {
	var buf [4096]byte
	got, err := Read("/proc/self/status", buf[:])
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	// Both name the process and its pid; VmRSS and the like may move between the reads.
	first := func(b []byte) string { return strings.SplitN(string(b), "\n", 2)[0] }
	if first(got) != first(want) || !strings.Contains(string(got), "\nPid:\t"+strconv.Itoa(os.Getpid())+"\n") {
		t.Fatalf("read %q, os.ReadFile %q", first(got), first(want))
	}
}

func TestReadBounds(t *testing.T) {
	p := write(t, strings.Repeat("x", 100))
	var small [99]byte
	if _, err := Read(p, small[:]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("100 bytes into 99: %v, want ErrTooLarge", err)
	}
	// A file that fills the buffer exactly cannot be told from a longer one.
	var exact [100]byte
	if _, err := Read(p, exact[:]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("100 bytes into 100: %v, want ErrTooLarge", err)
	}
	var room [101]byte
	if got, err := Read(p, room[:]); err != nil || len(got) != 100 {
		t.Fatalf("100 bytes into 101: %d, %v", len(got), err)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing"), room[:]); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing file: %v, want os.ErrNotExist naming the path", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(link, room[:]); err == nil {
		t.Fatal("a symlink as the last element was followed")
	}
}

func TestUintAndKeyed(t *testing.T) {
	if v, err := Uint(write(t, "123456789012\n")); err != nil || v != 123456789012 {
		t.Fatalf("Uint: %d, %v", v, err)
	}
	if _, err := Uint(write(t, "12 cats\n")); err == nil {
		t.Fatal("Uint of garbage: no error")
	}
	oom := write(t, "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
	for key, want := range map[string]uint64{"oom_kill": 7, "under_oom": 0, "absent": 0} {
		if v, err := Keyed(oom, key); err != nil || v != want {
			t.Errorf("Keyed %s: %d, %v, want %d", key, v, err, want)
		}
	}
	if v, err := Keyed(write(t, "oom_kill 9"), "oom_kill"); err != nil || v != 9 {
		t.Errorf("Keyed without a final newline: %d, %v", v, err)
	}
	if _, err := Keyed(write(t, "oom_kill x\n"), "oom_kill"); err == nil {
		t.Error("Keyed of garbage: no error")
	}
	if v, err := Uint("/proc/sys/kernel/pid_max"); err != nil || v == 0 {
		t.Errorf("Uint of /proc/sys/kernel/pid_max: %d, %v", v, err)
	}
}

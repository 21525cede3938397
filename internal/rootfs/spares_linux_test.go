package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fsUUID is the ext4 UUID of image (blkid, from its superblock).
func fsUUID(t *testing.T, image string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-o", "value", "-s", "UUID", image).Output()
	if err != nil {
		t.Fatalf("blkid %s: %v", image, err)
	}
	return strings.TrimSpace(string(out))
}

func TestSparesAreTakenOnceAndOnlyAtTheirSize(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	requireHost(t, "blkid")
	dir := filepath.Join(t.TempDir(), "spares")
	s, err := NewSpares(dir, 64, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.make(context.Background()); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || s.Ready() != 1 {
		t.Fatalf("after one make: %d files, %d ready", len(ents), s.Ready())
	}
	spare := filepath.Join(dir, ents[0].Name())
	uuid := fsUUID(t, spare)
	lowers := newLowers(t)

	// Another size formats its own and leaves the spare.
	other := t.TempDir()
	if _, err := s.Prepare(context.Background(), other, lowers, 32, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Teardown(context.Background(), other) })
	if s.Ready() != 1 {
		t.Errorf("a 32 MiB workspace took the 64 MiB spare")
	}

	first, second := t.TempDir(), t.TempDir()
	// An interrupted mkfs's scratch image goes even when a spare is used.
	stale := LayoutOf(first).Image + ".new"
	if err := os.WriteFile(stale, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{first, second} {
		root, err := s.Prepare(context.Background(), d, lowers, 64, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = Teardown(context.Background(), d) })
		if _, err := os.Stat(filepath.Join(root, "bin/busybox")); err != nil {
			t.Errorf("overlay of %s: %v", d, err)
		}
		if st, err := os.Stat(LayoutOf(d).Image); err != nil || st.Size() != 64<<20 {
			t.Errorf("image of %s: %v %v", d, st, err)
		}
	}
	if got := fsUUID(t, LayoutOf(first).Image); got != uuid {
		t.Errorf("the first workspace is %s, not the spare %s", got, uuid)
	}
	if got := fsUUID(t, LayoutOf(second).Image); got == uuid {
		t.Error("the spare was handed out twice")
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale %s survived a Prepare from a spare: %v", stale, err)
	}
	if _, err := os.Lstat(spare); !os.IsNotExist(err) {
		t.Errorf("the taken spare is still in the spares dir: %v", err)
	}
	// A fresh workspace is as Prepare makes it: writable, the disk its size.
	if err := os.WriteFile(filepath.Join(LayoutOf(first).RootFS, "x"), []byte("x"), 0o644); err != nil {
		t.Error(err)
	}
}

func TestNewSparesKeepsOnlyFinishedImagesOfItsSize(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	dir := filepath.Join(t.TempDir(), "spares")
	s, err := NewSpares(dir, 64, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.make(context.Background()); err != nil {
		t.Fatal(err)
	}
	good, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	outside := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(outside, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	sized := func(n int64) func(string) error {
		return func(p string) error {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				return err
			}
			return os.Truncate(p, n)
		}
	}
	junk := map[string]func(p string) error{
		"64-aaaa.img.new": sized(64 << 20),                                        // an interrupted mkfs
		"64-bbbb.img":     sized(1 << 20),                                         // not its size
		"32-cccc.img":     sized(32 << 20),                                        // another size's
		"64-dddd.img":     func(p string) error { return os.Symlink(outside, p) }, // not a regular file
		"64-eeee.img":     func(p string) error { return os.Mkdir(p, 0o700) },     // a directory
		"junk":            sized(0),                                               // no image at all
	}
	for name, mk := range junk {
		if err := mk(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := NewSpares(dir, 64, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || filepath.Join(dir, ents[0].Name()) != good[0] || s2.Ready() != 1 {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left %v (ready %d), want only %s", names, s2.Ready(), filepath.Base(good[0]))
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host" {
		t.Errorf("the symlink's target was touched: %q %v", b, err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("spares dir mode: %v %v", st, err)
	}
}

func TestSparesRunRefillsAndStops(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	s, err := NewSpares(filepath.Join(t.TempDir(), "spares"), 16, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	waitReady := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for s.Ready() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d ready, want %d", s.Ready(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitReady(2)
	d := t.TempDir()
	if _, err := s.Prepare(context.Background(), d, newLowers(t), 16, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Teardown(context.Background(), d) })
	waitReady(2) // the take woke a refill
	// A make that fails (here: the dir is gone) stops the refill until the
	// next create asks, even one that finds none ready.
	for s.Ready() > 0 {
		s.mu.Lock()
		s.ready = s.ready[1:]
		s.mu.Unlock()
	}
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	s.wake <- struct{}{}
	time.Sleep(100 * time.Millisecond) // Run tries, fails and waits
	if s.Ready() != 0 {
		t.Fatalf("%d ready with no spares dir", s.Ready())
	}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d2 := t.TempDir()
	if _, err := s.Prepare(context.Background(), d2, newLowers(t), 16, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Teardown(context.Background(), d2) })
	waitReady(2) // the empty ask woke it
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

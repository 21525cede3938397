package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
		if s.ready[0].mnt >= 0 {
			_ = unix.Close(s.ready[0].mnt)
		}
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

// readyMounts returns the ready spares' images and mount fds.
func readyMounts(s *Spares) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, sp := range s.ready {
		out[sp.path] = sp.mnt
	}
	return out
}

// TestSparesMountedAhead: while Run runs, each ready image is mounted
// detached (a loop device is bound to it, yet no mountinfo line shows it),
// a Prepare moves that mount to the workspace as mkdirsIn would have made
// it, and when Run returns the spares still ready are unmounted and their
// devices gone, to be mounted again by the next Run.
func TestSparesMountedAhead(t *testing.T) {
	requireHost(t, "mkfs.ext4", "blkid")
	dir := filepath.Join(t.TempDir(), "spares")
	s, err := NewSpares(dir, 64, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
	defer stop()
	deadline := time.Now().Add(20 * time.Second)
	for len(readyMounts(s)) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d ready, want 2", s.Ready())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[string]string{}
	for image, mnt := range readyMounts(s) {
		if mnt < 0 {
			t.Fatalf("spare %s is not mounted ahead (noMount %v)", image, s.noMount)
		}
		devs := attachedLoops(image)
		if len(devs) != 1 {
			t.Fatalf("spare %s: loop devices %v, want one", image, devs)
		}
		if strings.Contains(string(mountinfo), "/dev/"+devs[0]+" ") {
			t.Errorf("spare %s's mount (/dev/%s) is in mountinfo: it should be detached", image, devs[0])
		}
		uuids[fsUUID(t, image)] = image
	}

	d := t.TempDir()
	root, err := s.Prepare(context.Background(), d, newLowers(t), 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := LayoutOf(d)
	if _, ok := uuids[fsUUID(t, l.Image)]; !ok {
		t.Fatalf("the workspace %s is not one of the spares %v", l.Image, uuids)
	}
	dev := loopNamed(mountedDevice(l.WS))
	if dev == "" || !backedBy(dev, l.Image) {
		t.Fatalf("ws is mounted from %q, not a loop device backed by %s", dev, l.Image)
	}
	for path, mode := range map[string]os.FileMode{l.WS: 0o700, l.Upper: 0o755, l.Work: 0o700} {
		if st, err := os.Stat(path); err != nil || !st.IsDir() || st.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want a dir of mode %o", path, st, err, mode)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(l.Upper, "x")); err != nil || string(b) != "x" {
		t.Errorf("a write in the rootfs is not in the moved workspace's upper: %q %v", b, err)
	}
	if err := Teardown(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if devs := attachedLoops(l.Image); len(devs) != 0 {
		t.Errorf("after Teardown %s is still attached to %v", l.Image, devs)
	}

	// The refill mounts a new one; stopping Run unmounts every ready one.
	deadline = time.Now().Add(20 * time.Second)
	for s.Ready() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d ready after the take, want 2", s.Ready())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	for image, mnt := range readyMounts(s) {
		if mnt >= 0 {
			t.Errorf("spare %s still has its mount fd after Run returned", image)
		}
		if devs := attachedLoops(image); len(devs) != 0 {
			t.Errorf("spare %s still attached to %v after Run returned", image, devs)
		}
	}
	s2, err := NewSpares(dir, 64, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Ready() != 2 {
		t.Errorf("the next NewSpares found %d spares, want the 2 left unmounted", s2.Ready())
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	go func() { s2.Run(ctx2); close(done2) }()
	deadline = time.Now().Add(20 * time.Second)
	for {
		n := 0
		for _, mnt := range readyMounts(s2) {
			if mnt >= 0 {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next Run mounted %d of the spares it found, want 2", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel2()
	<-done2
}

// TestAttachWSFallsBackToMount: a spare's fd that cannot be moved (here
// not a mount at all) is closed and the image is mounted instead.
func TestAttachWSFallsBackToMount(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	d := t.TempDir()
	l := LayoutOf(d)
	if err := os.MkdirAll(l.WS, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := formatImage(context.Background(), l.Image, 64); err != nil {
		t.Fatal(err)
	}
	notMount, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := attachWS(context.Background(), l, notMount); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = Teardown(context.Background(), d) }()
	if dev := loopNamed(mountedDevice(l.WS)); dev == "" || !backedBy(dev, l.Image) {
		t.Errorf("ws is mounted from %q, want a loop device backed by %s", dev, l.Image)
	}
	if err := unix.Fstat(notMount, &unix.Stat_t{}); err == nil {
		t.Error("attachWS left the spare's fd open")
	}
}

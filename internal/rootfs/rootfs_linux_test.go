package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newLowers builds a busybox lower and a small top layer that shadows one file.
func newLowers(t *testing.T) []string {
	t.Helper()
	base := filepath.Join(t.TempDir(), "base")
	if err := BusyboxRootFS(base); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(t.TempDir(), "top")
	if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(top, "etc/hostname"), []byte("top\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{top, base}
}

func prepared(t *testing.T, lowers []string, diskMiB int64) (dir, root string) {
	t.Helper()
	dir = t.TempDir()
	root, err := Prepare(context.Background(), dir, lowers, diskMiB, nil)
	t.Cleanup(func() {
		if err := Teardown(context.Background(), dir); err != nil {
			t.Errorf("cleanup teardown: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir, root
}

func loopsBackedBy(image string) []string {
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, m := range matches {
		b, _ := os.ReadFile(m)
		if strings.TrimSpace(string(b)) == image {
			out = append(out, m)
		}
	}
	return out
}

func TestPrepareTeardownRemount(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	ctx := context.Background()
	lowers := newLowers(t)
	dir, root := prepared(t, lowers, 64)
	l := LayoutOf(dir)

	if !Mounted(dir) || !isMountPoint(l.WS) {
		t.Fatalf("after Prepare: Mounted=%v ws mounted=%v", Mounted(dir), isMountPoint(l.WS))
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/hostname")); err != nil || string(b) != "top\n" {
		t.Fatalf("top layer does not shadow base: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin/busybox")); err != nil {
		t.Fatalf("base layer not visible: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "home/user/note"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.Upper, "home/user/note")); err != nil {
		t.Fatalf("write did not land in the upper dir: %v", err)
	}
	if _, err := Prepare(ctx, dir, lowers, 64, nil); err == nil {
		t.Fatal("second Prepare of the same dir succeeded")
	}

	for i := 0; i < 2; i++ { // idempotent
		if err := Teardown(ctx, dir); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
	}
	if Mounted(dir) || isMountPoint(l.WS) {
		t.Fatal("still mounted after Teardown")
	}
	if got := loopsBackedBy(l.Image); len(got) != 0 {
		t.Fatalf("loop devices still attached after Teardown: %v", got)
	}

	// Host reboot: the image survives, the mounts do not.
	root2, err := Remount(ctx, dir, lowers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root2, "home/user/note")); err != nil || string(b) != "kept" {
		t.Fatalf("workspace lost across Remount: %q, %v", b, err)
	}
	if _, err := Remount(ctx, dir, lowers, nil); err != nil {
		t.Fatalf("Remount of a mounted dir: %v", err)
	}
	if _, err := Remount(ctx, t.TempDir(), lowers, nil); err == nil {
		t.Fatal("Remount without an image succeeded")
	}
}

func TestDiskLimit(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	dir, root := prepared(t, newLowers(t), 16)
	f, err := os.Create(filepath.Join(root, "tmp/fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var werr error
	written := 0
	for i := 0; i < 64 && werr == nil; i++ {
		var n int
		n, werr = f.Write(buf)
		written += n
	}
	if werr == nil {
		werr = f.Sync()
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing 64 MiB into a 16 MiB disk: err = %v after %d bytes, want ENOSPC", werr, written)
	}
	var st unix.Stat_t
	if err := unix.Stat(LayoutOf(dir).Image, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 16<<20 {
		t.Fatalf("image uses %d bytes on the host, more than its 16 MiB limit", used)
	}
}

func TestPrepareRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	if _, err := Prepare(context.Background(), dir, nil, 64, nil); err == nil {
		t.Fatal("Prepare without lowers succeeded")
	}
	if _, err := Prepare(context.Background(), dir, []string{"/x"}, 1, nil); err == nil {
		t.Fatal("Prepare with a 1 MiB disk succeeded")
	}
	if _, err := os.Stat(LayoutOf(dir).Image); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bad input left an image behind: %v", err)
	}
}

func TestBusyboxRootFS(t *testing.T) {
	requireHost(t, "chroot")
	dir := t.TempDir()
	if err := BusyboxRootFS(dir); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		path     string
		mode     os.FileMode
		uid, gid uint32
	}{
		{"tmp", 0o777 | os.ModeSticky | os.ModeDir, 0, 0},
		{"home/user", 0o755 | os.ModeDir, 1000, 1000},
		{"root", 0o700 | os.ModeDir, 0, 0},
	}
	for _, c := range checks {
		fi, err := os.Stat(filepath.Join(dir, c.path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || st.Uid != c.uid || st.Gid != c.gid {
			t.Errorf("%s: mode %v uid %d gid %d, want %v %d %d", c.path, fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.gid)
		}
	}
	out, err := exec.Command("chroot", dir, "/bin/sh", "-c", "id -un; grep ^user: /etc/passwd | cut -d: -f3,6; ls /usr/bin/awk").CombinedOutput()
	if err != nil {
		t.Fatalf("shell in the rootfs: %v: %s", err, out)
	}
	if want := "root\n1000:/home/user\n/usr/bin/awk\n"; string(out) != want {
		t.Errorf("shell output %q, want %q", out, want)
	}
}

func BenchmarkPrepareTeardown(b *testing.B) {
	requireHost(b, "mkfs.ext4")
	base := filepath.Join(b.TempDir(), "base")
	if err := BusyboxRootFS(base); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, mib := range []int64{1024, 10240} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				dir := b.TempDir()
				if _, err := Prepare(ctx, dir, []string{base}, mib, nil); err != nil {
					b.Fatal(err)
				}
				if err := Teardown(ctx, dir); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTeardownWaitsForItsLoopDevice: the workspace still mounted in a
// dying sandbox's mount namespace keeps its loop device bound after the
// host's unmount; Teardown returns only once the device is free. A device
// left bound without a mount (a crash between attach and mount) is found
// by the scan of every device and detached.
func TestTeardownWaitsForItsLoopDevice(t *testing.T) {
	requireHost(t, "mkfs.ext4", "unshare", "losetup")
	ctx := context.Background()
	dir, _ := prepared(t, newLowers(t), 64)
	l := LayoutOf(dir)
	dev := loopNamed(mountedDevice(l.WS))
	if dev == "" {
		t.Fatalf("no loop device behind %s (mounted device %q)", l.WS, mountedDevice(l.WS))
	}
	// A private mount namespace holds a copy of the workspace mount for 1 s.
	hold := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "1")
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer hold.Wait()
	time.Sleep(200 * time.Millisecond) // the namespace exists
	start := time.Now()
	if err := Teardown(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("Teardown returned after %v while another namespace still mounted the workspace", took)
	}
	if got := loopsBackedBy(l.Image); len(got) != 0 {
		t.Fatalf("loop devices still attached after Teardown: %v", got)
	}

	out, err := exec.Command("losetup", "--find", "--show", l.Image).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	if err := Teardown(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if got := loopsBackedBy(l.Image); len(got) != 0 {
		t.Fatalf("the stray %s is still attached after Teardown: %v", strings.TrimSpace(string(out)), got)
	}
}

// TestPrepareFormatsBeforeThePath: while mkfs runs, nothing is at
// disk.img (a daemon killed then would leave an image its next start
// mounts and fails on with EIO); a scratch image an earlier crash left is
// replaced; after Prepare only disk.img is there.
func TestPrepareFormatsBeforeThePath(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	real, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Fatal(err)
	}
	bin, sync := t.TempDir(), t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\ntouch %[1]s/started\nwhile [ ! -e %[1]s/go ]; do sleep 0.01; done\nexec %[2]s \"$@\"\n", sync, real)
	if err := os.WriteFile(filepath.Join(bin, "mkfs.ext4"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	dir := t.TempDir()
	l := LayoutOf(dir)
	if err := os.WriteFile(l.Image+".new", []byte("half an image from a crash"), 0o600); err != nil {
		t.Fatal(err)
	}
	lowers := newLowers(t)
	done := make(chan error, 1)
	go func() {
		_, err := Prepare(context.Background(), dir, lowers, 64, nil)
		done <- err
	}()
	t.Cleanup(func() { _ = Teardown(context.Background(), dir) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(sync, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("mkfs never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := os.Lstat(l.Image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("disk.img exists while mkfs runs: %v", err)
	}
	if st, err := os.Stat(l.Image + ".new"); err != nil || st.Size() != 64<<20 {
		t.Errorf("scratch image while mkfs runs: %v, %v", st, err)
	}
	if err := os.WriteFile(filepath.Join(sync, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(l.Image + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch image left after Prepare: %v", err)
	}
	if !Mounted(dir) {
		t.Error("not mounted after Prepare")
	}
}

// TestMountedDeviceAgreesWithMountinfo checks the statx answer against
// mountinfo's for each kind of path it is asked about: the ext4
// workspace, the overlay root, a plain dir, a missing path, a symlink to a
// mount point (not followed), a bind mount, and two mounts stacked on one
// path (the top one counts).
func TestMountedDeviceAgreesWithMountinfo(t *testing.T) {
	requireHost(t, "mkfs.ext4")
	dir, root := prepared(t, newLowers(t), 64)
	l := LayoutOf(dir)
	plain := filepath.Join(t.TempDir(), "plain")
	bind := filepath.Join(t.TempDir(), "bind")
	link := filepath.Join(t.TempDir(), "link")
	for _, p := range []string{plain, bind} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(l.WS, link); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(plain, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bind, unix.MNT_DETACH) })
	stacked := filepath.Join(t.TempDir(), "stacked")
	if err := os.Mkdir(stacked, 0o700); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := unix.Mount("tmpfs", stacked, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(stacked, unix.MNT_DETACH) })
	}
	want := map[string]bool{l.WS: true, root: true, plain: false, plain + "/missing": false, link: false, bind: true, stacked: true}
	for p, mounted := range want {
		got, mi := mountedDevice(p), mountinfoDevice(p)
		if got != mi || (got != "") != mounted {
			t.Errorf("%s: statx %q, mountinfo %q, want mounted=%v", p, got, mi, mounted)
		}
	}
	if loopNamed(mountedDevice(l.WS)) == "" {
		t.Errorf("workspace %s: device %q is no loop device", l.WS, mountedDevice(l.WS))
	}
}

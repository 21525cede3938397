package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// errRecorder is a testing.TB that records Errorf.
type errRecorder struct {
	testing.TB
	msgs []string
}

func (r *errRecorder) Helper() {}
func (r *errRecorder) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// TestRemoveAllChecked plants what a sandbox left running leaves — a
// mount (below a path with a space, which mountinfo escapes) and a loop
// device on a file in the directory — and checks both are named, the
// directory kept, and, once they are gone, the directory removed.
func TestRemoveAllChecked(t *testing.T) {
	RequireRoot(t)
	losetup := RequireTool(t, "losetup")
	base, err := os.MkdirTemp("", "leak")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	dir := filepath.Join(base, "data dir")
	mnt := filepath.Join(dir, "sandboxes", "x", "ws")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}()
	img := filepath.Join(dir, "sandboxes", "x", "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	attached := true
	defer func() {
		if attached {
			_ = exec.Command(losetup, "-d", loop).Run()
		}
	}()
	// A sibling whose name extends dir's is not under it.
	sibling := dir + "2"
	if err := os.MkdirAll(sibling, 0o700); err != nil {
		t.Fatal(err)
	}
	if leaks, err := HostLeaks(sibling); err != nil || len(leaks) != 0 {
		t.Errorf("HostLeaks(%s) = %q, %v; want none", sibling, leaks, err)
	}

	if ms, err := MountsUnder(dir); err != nil || len(ms) != 1 || ms[0] != mnt {
		t.Errorf("MountsUnder(%s) = %q, %v; want [%s]", dir, ms, err, mnt)
	}

	r := &errRecorder{TB: t}
	RemoveAllChecked(r, dir)
	if len(r.msgs) != 1 || !strings.Contains(r.msgs[0], "mount "+mnt+" (tmpfs") ||
		!strings.Contains(r.msgs[0], "loop device "+loop+" backed by "+img) {
		t.Fatalf("RemoveAllChecked with a mount and a loop device reported %q", r.msgs)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("the directory was not kept: %v", err)
	}
	// What os.RemoveAll used to leave: the image unlinked, its loop device
	// still attached.
	if err := os.Remove(img); err != nil {
		t.Fatal(err)
	}
	if leaks, err := HostLeaks(dir); err != nil || !strings.Contains(strings.Join(leaks, "\n"), "loop device "+loop+" backed by "+img+" (deleted)") {
		t.Fatalf("HostLeaks with the image unlinked = %q, %v", leaks, err)
	}

	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if out, err := exec.Command(losetup, "-d", loop).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d: %v: %s", err, out)
	}
	attached = false
	r.msgs = nil
	RemoveAllChecked(r, dir)
	if len(r.msgs) != 0 {
		t.Fatalf("RemoveAllChecked of a clean dir reported %q", r.msgs)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("clean dir not removed: %v", err)
	}
}

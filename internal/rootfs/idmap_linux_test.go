package rootfs

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func owner(t *testing.T, p string) [2]uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint32{st.Uid, st.Gid}
}

// An idmapped workspace shows the layers shifted, keeps the layers
// themselves unshifted, and its capture comes back unshifted.
func TestPrepareIdmapped(t *testing.T) {
	t.Run("detached layers", testPrepareIdmapped)
	t.Run("attached layers", func(t *testing.T) { // kernels whose overlayfs wants paths
		detachedLayers = false
		t.Cleanup(func() { detachedLayers = true })
		testPrepareIdmapped(t)
	})
}

func testPrepareIdmapped(t *testing.T) {
	ctx := context.Background()
	lowers := newLowers(t)
	if err := os.MkdirAll(filepath.Join(lowers[0], "home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(lowers[0], "home/user"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	m := &IDMap{HostID: 2000000000, Size: 65536}
	dir := t.TempDir()
	root, err := Prepare(ctx, dir, lowers, 64, m)
	t.Cleanup(func() {
		if err := Teardown(context.Background(), dir); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][2]uint32{
		"":             {m.HostID, m.HostID},
		"etc/hostname": {m.HostID, m.HostID},
		"home/user":    {m.HostID + 1000, m.HostID + 1000},
		"bin":          {m.HostID, m.HostID},
	} {
		if got := owner(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s in the overlay: owner %v, want %v", p, got, want)
		}
	}
	if got := owner(t, filepath.Join(lowers[0], "etc/hostname")); got != [2]uint32{0, 0} {
		t.Errorf("the layer itself was shifted: %v", got)
	}
	if _, err := os.Stat(idmapDir(LayoutOf(dir))); !os.IsNotExist(err) {
		t.Errorf("idmapped lowers left mounted: %v", err)
	}
	// What a process in the namespace writes: shifted ids, a v3 file capability.
	f := filepath.Join(root, "home/user/notes")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(f, int(m.HostID+1000), int(m.HostID+1000)); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "ping")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(bin, int(m.HostID), int(m.HostID)); err != nil {
		t.Fatal(err)
	}
	v3 := make([]byte, 24)
	binary.LittleEndian.PutUint32(v3, 0x03000000)
	binary.LittleEndian.PutUint32(v3[4:], 1<<13) // cap_net_raw permitted
	binary.LittleEndian.PutUint32(v3[20:], m.HostID)
	if err := unix.Lsetxattr(bin, capXattr, v3, 0); err != nil {
		t.Fatal(err)
	}
	if got := owner(t, filepath.Join(LayoutOf(dir).Upper, "home/user/notes")); got != [2]uint32{m.HostID + 1000, m.HostID + 1000} {
		t.Errorf("upper holds %v, want the shifted host ids", got)
	}
	out := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CopyUpperUnshifted(ctx, LayoutOf(dir).Upper, out, m); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][2]uint32{".": {0, 0}, "home/user/notes": {1000, 1000}, "ping": {0, 0}} {
		if got := owner(t, filepath.Join(out, p)); got != want {
			t.Errorf("captured %s: owner %v, want %v", p, got, want)
		}
	}
	caps, err := getXattr(filepath.Join(out, "ping"), capXattr)
	if err != nil {
		t.Fatal(err)
	}
	want := append(binary.LittleEndian.AppendUint32(nil, 0x02000000), v3[4:20]...)
	if d := cmp.Diff(want, caps); d != "" {
		t.Errorf("captured file capability is not revision 2 (-want +got):\n%s", d)
	}
}

func TestIDMapUnshift(t *testing.T) {
	m := &IDMap{HostID: 2000000000, Size: 65536}
	for in, want := range map[uint32]uint32{2000000000: 0, 2000001000: 1000, 0: 0, 1000: 1000, 70000: 65534, 2000065536: 65534} {
		if got := m.Unshift(in); got != want {
			t.Errorf("Unshift(%d) = %d, want %d", in, got, want)
		}
	}
	if got := (*IDMap)(nil).Unshift(7); got != 7 {
		t.Errorf("nil map changed an id: %d", got)
	}
	if _, err := ParseIDMap(m.String()); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "0:10", "5", "4294967295:2", "a:b"} {
		if _, err := ParseIDMap(bad); err == nil {
			t.Errorf("ParseIDMap(%q) accepted", bad)
		}
	}
}

// Teardown also removes mounts a crash left in the sandbox dir (a runtime's
// sysfs, attached idmapped layers), so removing the dir never walks into one.
func TestTeardownDetachesLeftovers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := Prepare(ctx, dir, newLowers(t), 64, &IDMap{HostID: 2000000000, Size: 65536}); err != nil {
		t.Fatal(err)
	}
	left := []string{filepath.Join(dir, "sysfs"), filepath.Join(idmapDir(LayoutOf(dir)), "0")}
	for _, p := range left {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := Teardown(ctx, dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(left, LayoutOf(dir).RootFS, LayoutOf(dir).WS) {
		if isMountPoint(p) {
			t.Errorf("%s still mounted after Teardown", p)
		}
	}
}

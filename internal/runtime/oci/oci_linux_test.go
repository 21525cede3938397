package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Host paths of the runtimes; the setup script installs them there.
const (
	runscPath = "/var/cache/berth/bin/runsc"
	criuPath  = "/var/cache/berth/bin/criu"
)

func newBackend(t testing.TB, name string) *OCI {
	t.Helper()
	cfg := Config{Root: filepath.Join(t.TempDir(), "state")}
	switch name {
	case Runc:
		runtimetest.RequireHost(t, "runc")
		criu := criuPath
		if p := os.Getenv("BERTH_CRIU"); p != "" {
			criu = p // as for berth serve: e.g. a stand-in, to see the suite on a host where CRIU hangs
		}
		if _, err := os.Stat(criu); err == nil {
			cfg.CRIU = criu
		} else if os.Getenv("CI") == "true" {
			t.Fatalf("criu not built at %s (scripts/build-criu.sh)", criu)
		}
	case Runsc:
		runtimetest.RequireHost(t, runscPath)
		cfg.Binary = runscPath
	}
	// runsc bind-mounts a shared empty netns into its root and never
	// unmounts it; TempDir's RemoveAll would fail with EBUSY.
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(cfg.Root, "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	o, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestRuncConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime { return newBackend(t, Runc) })
}

func TestRunscConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime { return newBackend(t, Runsc) })
}

// TestRuncCheckpointUserNS: CRIU checkpoints and restores a runc sandbox in
// a user namespace, both when runc makes its network namespace and when the
// sandbox joins one made beforehand by the host (as berth's daemon does,
// for its veth and nftables), and its processes carry on, with their pid,
// their user namespace mapping and, when joined, the host's netns.
func TestRuncCheckpointUserNS(t *testing.T) {
	o := newBackend(t, Runc)
	if c := o.Capabilities(context.Background()); !c.Checkpoint {
		runtimetest.RequireHost(t, criuPath)
		if os.Getenv("CI") == "true" {
			t.Fatalf("runc cannot checkpoint here: %s", c.CheckpointReason)
		}
		t.Skipf("runc cannot checkpoint here: %s", c.CheckpointReason)
	}
	for _, joined := range []bool{false, true} {
		t.Run(fmt.Sprintf("joined-netns=%v", joined), func(t *testing.T) { checkpointUserNS(t, o, joined) })
	}
}

func checkpointUserNS(t *testing.T, o *OCI, joinNetns bool) {
	ctx := context.Background()
	base := t.TempDir()
	// runc's init reaches the root filesystem as the mapped root.
	m := rootfs.IDMap{HostID: 2000000000, Size: 65536}
	dir, root := busyboxBundle(t, base, &m, true)
	id := fmt.Sprintf("uns%d", time.Now().UnixNano()%1e9)
	spec := runtime.Spec{ID: id, BundleDir: dir, RootFS: root,
		Args:   []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"},
		UserNS: &runtime.IDMap{HostID: m.HostID, Size: m.Size}}
	var netnsIno uint64
	if joinNetns {
		spec.NetNSPath = hostNetns(t, "berth-t"+id)
		var st unix.Stat_t
		if err := unix.Stat(spec.NetNSPath, &st); err != nil {
			t.Fatal(err)
		}
		netnsIno = st.Ino
	}
	if err := o.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Delete(context.Background(), id) })
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(root, "tmp/count"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	waitCount := func(atLeast int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for count() < atLeast {
			if time.Now().After(deadline) {
				t.Fatalf("counter stuck at %d, want %d", count(), atLeast)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCount(3)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	img := filepath.Join(dir, "memory")
	if err := o.Checkpoint(cctx, id, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if err := o.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	before := count()
	if err := o.Restore(cctx, spec, img); err != nil {
		t.Fatalf("restore: %v", err)
	}
	waitCount(before + 3)
	st, err := o.State(ctx, id)
	if err != nil || st.Pid == 0 {
		t.Fatalf("state after restore: %+v %v", st, err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", st.Pid))
	if err != nil || strings.Join(strings.Fields(string(b)), " ") != "0 2000000000 65536" {
		t.Fatalf("restored PID 1 uid_map %q (%v)", b, err)
	}
	if joinNetns {
		var ns unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", st.Pid), &ns); err != nil || ns.Ino != netnsIno {
			t.Fatalf("restored PID 1 in netns %d (%v), want the joined one %d", ns.Ino, err, netnsIno)
		}
	}
}

// hostNetns makes a network namespace owned by the host's user namespace,
// as berth's daemon does for a sandbox, and removes it at the end.
func hostNetns(t *testing.T, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	return filepath.Join("/run/netns", name)
}

// busyboxBundle prepares a bundle dir (base/sb) with an overlay root of the
// busybox rootfs (base/lower) and returns the dir and the root; m maps its
// ids (nil: none). The bundle is torn down after the test. With
// traversable, base and its parents below /tmp become 0711 (and a mapped
// bundle dir too, as the daemon's shareSandboxDir), so a mapped root can
// reach the root filesystem.
func busyboxBundle(t testing.TB, base string, m *rootfs.IDMap, traversable bool) (dir, root string) {
	t.Helper()
	if traversable {
		for p := base; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
			if err := os.Chmod(p, 0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	lower := filepath.Join(base, "lower")
	if err := rootfs.BusyboxRootFS(lower); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(base, "sb")
	root, err := rootfs.Prepare(context.Background(), dir, []string{lower}, 64, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rootfs.Teardown(context.Background(), dir) })
	if m != nil && traversable {
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir, root
}

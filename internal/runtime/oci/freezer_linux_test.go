package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
)

// TestRuncFreezerAndKillInit: runc's Freeze and Thaw (the freezer cgroup
// written directly, no runc exec) stop and resume every process of the
// container and runc reports the states; KillInit picks the container's
// PID 1 among the processes of its cgroup and returns once every process
// of the container is gone.
func TestRuncFreezerAndKillInit(t *testing.T) {
	o := newBackend(t, Runc)
	ctx := context.Background()
	base := t.TempDir()
	m := rootfs.IDMap{HostID: 2000000000, Size: 65536}
	dir, root := busyboxBundle(t, base, &m, true)
	id := fmt.Sprintf("frz%d", time.Now().UnixNano()%1e9)
	spec := runtime.Spec{ID: id, BundleDir: dir, RootFS: root,
		Args: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000 & " +
			"i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done"},
		UserNS: &runtime.IDMap{HostID: m.HostID, Size: m.Size}}
	if err := o.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Delete(context.Background(), id) })
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(root, "tmp/count"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	procs := func() []int {
		pids, err := readPids(filepath.Join(o.cfg.CgroupRoot, "freezer", CgroupPath(id), "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	eventually("the counter runs", func() bool { return count() >= 3 })
	eventually("the children run", func() bool { return len(procs()) >= 3 })

	// Freeze and thaw.
	if err := o.Freeze(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := o.State(ctx, id); err != nil || st.State != "paused" {
		t.Fatalf("after Freeze: %+v %v, want paused", st, err)
	}
	frozen := count()
	time.Sleep(200 * time.Millisecond) // ten ticks of the counter, were it running
	if got := count(); got != frozen {
		t.Fatalf("the counter moved from %d to %d while frozen", frozen, got)
	}
	if err := o.Thaw(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := o.State(ctx, id); err != nil || st.State != "running" {
		t.Fatalf("after Thaw: %+v %v, want running", st, err)
	}
	eventually("the counter runs again", func() bool { return count() > frozen+2 })

	// Exactly one process of the cgroup is the container's PID 1. (A
	// namespace nested inside the sandbox's, whose init would be in the
	// cgroup too, is refused to a berth sandbox: unshare -r -p fails with
	// EPERM; isInitOf takes only an init one level down anyway.)
	st, err := o.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var inits []int
	for _, pid := range procs() {
		if isInitOf(pid, CgroupPath(id)) {
			inits = append(inits, pid)
		}
	}
	if len(inits) != 1 || inits[0] != st.Pid {
		t.Fatalf("inits in the cgroup = %v, want only runc's PID 1 %d", inits, st.Pid)
	}
	if isInitOf(os.Getpid(), CgroupPath(id)) {
		t.Fatal("the test process counts as the container's init")
	}

	if err := o.KillInit(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if left := procs(); len(left) != 0 {
		t.Fatalf("processes left after KillInit: %v", left)
	}
	if st, err := o.State(ctx, id); err != nil || st.State != "stopped" {
		t.Fatalf("after KillInit: %+v %v, want stopped", st, err)
	}
	if err := o.KillInit(ctx, id, time.Second); !errs.Is(err, errs.NotFound) {
		t.Fatalf("KillInit of a stopped container = %v, want NotFound", err)
	}
}

// TestRunscNotFrozenFromOutside: runsc is never frozen through its cgroup
// (its processes die of it) and has no host PID 1 to kill.
func TestRunscNotFrozenFromOutside(t *testing.T) {
	o := newBackend(t, Runsc)
	ctx := context.Background()
	if err := o.freezeCgroup(ctx, "abc"); !errs.Is(err, errs.NotImplemented) {
		t.Fatalf("freezeCgroup on runsc = %v, want NotImplemented", err)
	}
	if err := o.KillInit(ctx, "abc", time.Second); !errs.Is(err, errs.NotImplemented) {
		t.Fatalf("KillInit on runsc = %v, want NotImplemented", err)
	}
}

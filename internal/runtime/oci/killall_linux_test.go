package oci

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/runtime"
)

// TestKillProcesses: on both backends, KillProcesses returns once no
// process of the container's cgroup is left — runc's PID 1 and its
// children, also while the container is frozen; runsc's Sentry (with its
// stubs) and gofer — and a container with nothing running is no error.
func TestKillProcesses(t *testing.T) {
	for _, tc := range []struct {
		rt     string
		freeze bool
	}{{Runc, false}, {Runc, true}, {Runsc, false}} {
		t.Run(fmt.Sprintf("%s/frozen=%v", tc.rt, tc.freeze), func(t *testing.T) {
			o := newBackend(t, tc.rt)
			ctx := context.Background()
			base := t.TempDir()
			dir, root := busyboxBundle(t, base, nil, true)
			id := fmt.Sprintf("kp%d", time.Now().UnixNano()%1e9)
			spec := runtime.Spec{ID: id, BundleDir: dir, RootFS: root,
				Args: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000 & exec sleep 1000"}}
			if err := o.Run(ctx, spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = o.Delete(context.Background(), id) })
			procs := func() []int {
				d, err := o.procsDir(id)
				if err != nil {
					return nil
				}
				p, _ := readPids(filepath.Join(d, "cgroup.procs"))
				return p
			}
			// runc: PID 1 and its two children; runsc: the Sentry and
			// the gofer at least.
			for deadline := time.Now().Add(10 * time.Second); len(procs()) < 3; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("cgroup of %s holds %v, want the container's processes", id, procs())
				}
			}
			if tc.freeze {
				if err := o.Freeze(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if err := o.KillProcesses(ctx, id, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if left := procs(); len(left) != 0 {
				t.Fatalf("processes left after KillProcesses: %v", left)
			}
			if err := o.KillProcesses(ctx, id, time.Second); err != nil {
				t.Fatalf("KillProcesses with nothing running = %v, want nil", err)
			}
			if err := o.Delete(ctx, id); err != nil {
				t.Fatalf("Delete after KillProcesses: %v", err)
			}
			if err := o.KillProcesses(ctx, id, time.Second); err != nil {
				t.Fatalf("KillProcesses of a deleted container = %v, want nil", err)
			}
		})
	}
}

package runtimetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// contract runs the part of the suite that asserts only through the
// interface: it holds for a backend with no kernel behind it.
func (e *env) contract(t *testing.T) {
	t.Run("Lifecycle", e.testLifecycle)
	t.Run("StartFailure", e.testStartFailure)
	if e.rt.Capabilities(context.Background()).Checkpoint {
		t.Run("CheckpointFork", e.testCheckpointFork)
	} else {
		t.Run("CheckpointRefused", e.testCheckpointRefused)
	}
}

const idle = `echo $$ > /run/x/pid; while true; do sleep 1; done`

func (e *env) testLifecycle(t *testing.T) {
	ctx := context.Background()
	if _, err := e.rt.State(ctx, "rtmissing"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State of a missing container: %v, want not_found", err)
	}
	b := e.start(t, boxOpts{script: idle})
	st, err := e.rt.State(ctx, b.id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "running" || st.Pid <= 0 || st.ID != b.id || st.Created.IsZero() {
		t.Fatalf("State = %+v, want running with a host pid", st)
	}
	list, err := e.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !containsID(list, b.id) {
		t.Fatalf("List = %+v does not contain %s", list, b.id)
	}
	stats, err := e.rt.Stats(ctx, b.id)
	if err != nil {
		t.Fatal(err)
	}
	if stats.MemoryBytes == 0 || stats.Pids == 0 || stats.CPUUsageNanos == 0 || stats.MemoryPeak < stats.MemoryBytes {
		t.Errorf("Stats = %+v, want nonzero memory, pids and cpu", stats)
	}

	if e.rt.Capabilities(ctx).Freeze {
		if err := e.rt.Freeze(ctx, b.id); err != nil {
			t.Fatal(err)
		}
		if st, err := e.rt.State(ctx, b.id); err != nil || st.State != "paused" {
			t.Fatalf("after Freeze: %+v, %v; want paused", st, err)
		}
		if err := e.rt.Thaw(ctx, b.id); err != nil {
			t.Fatal(err)
		}
		if st, err := e.rt.State(ctx, b.id); err != nil || st.State != "running" {
			t.Fatalf("after Thaw: %+v, %v; want running", st, err)
		}
	}

	if err := e.rt.Kill(ctx, b.id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		st, err := e.rt.State(ctx, b.id)
		return err == nil && st.State == "stopped"
	}, func() string {
		st, err := e.rt.State(ctx, b.id)
		return "never stopped: " + st.State + " " + errString(err)
	})
	for i := 0; i < 2; i++ {
		if err := e.rt.Delete(ctx, b.id); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := e.rt.State(ctx, b.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State after Delete: %v, want not_found", err)
	}
	if err := e.rt.Kill(ctx, b.id, syscall.SIGTERM); err == nil {
		t.Fatal("Kill of a deleted container succeeded")
	}
	if list, err := e.rt.List(ctx); err != nil || containsID(list, b.id) {
		t.Fatalf("List after Delete = %+v, %v; want it without %s", list, err, b.id)
	}
}

// testStartFailure: a start that cannot succeed (its root filesystem is
// missing) fails and leaves no container behind.
func (e *env) testStartFailure(t *testing.T) {
	ctx := context.Background()
	b := e.prepare(t, boxOpts{script: idle})
	b.spec.RootFS = filepath.Join(b.dir, "no-such-rootfs")
	t.Cleanup(func() { _ = e.rt.Delete(context.Background(), b.id) })
	if err := e.rt.Run(ctx, b.spec); err == nil {
		t.Fatalf("Run over a missing root filesystem succeeded")
	}
	if _, err := e.rt.State(ctx, b.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State after a failed Run: %v, want not_found (nothing left behind)", err)
	}
}

// testCheckpointFork: a checkpointed container can be deleted, and its
// image restored twice into two independent containers; a missing image
// is an error that leaves nothing behind. (The kernel part checks that
// memory comes back.)
func (e *env) testCheckpointFork(t *testing.T) {
	ctx := context.Background()
	src := e.start(t, boxOpts{script: idle, hostname: "forked"})
	image := filepath.Join(e.base, src.id+"-mem")
	if err := e.rt.Checkpoint(ctx, src.id, image); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := e.rt.Delete(ctx, src.id); err != nil {
		t.Fatalf("Delete after Checkpoint: %v", err)
	}
	if _, err := e.rt.State(ctx, src.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State after Checkpoint+Delete: %v, want not_found", err)
	}
	var kids []*box
	for i := 0; i < 2; i++ {
		kid := e.prepare(t, boxOpts{script: idle, hostname: "forked"})
		e.run(t, kid, func(ctx context.Context) error { return e.rt.Restore(ctx, kid.spec, image) })
		kids = append(kids, kid)
	}
	for _, kid := range kids {
		if st, err := e.rt.State(ctx, kid.id); err != nil || st.State != "running" || st.ID != kid.id {
			t.Errorf("restored %s: %+v, %v; want running", kid.id, st, err)
		}
	}
	if err := e.rt.Delete(ctx, kids[0].id); err != nil {
		t.Fatal(err)
	}
	if st, err := e.rt.State(ctx, kids[1].id); err != nil || st.State != "running" {
		t.Errorf("deleting one restored container stopped the other: %+v, %v", st, err)
	}

	lost := e.prepare(t, boxOpts{script: idle, hostname: "forked"})
	t.Cleanup(func() { _ = e.rt.Delete(context.Background(), lost.id) })
	missing := filepath.Join(e.base, lost.id+"-no-image")
	if err := e.rt.Restore(ctx, lost.spec, missing); err == nil {
		t.Fatalf("Restore from a missing image succeeded")
	}
	if _, err := e.rt.State(ctx, lost.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State after a failed Restore: %v, want not_found", err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("a failed Restore created the image directory %s", missing)
	}
}

// testCheckpointRefused is the honest outcome on a host where the backend
// cannot checkpoint (runc whose trial checkpoint failed): it says why, and
// Checkpoint and Restore refuse at once with FailedPrecondition, leaving
// the container running.
func (e *env) testCheckpointRefused(t *testing.T) {
	ctx := context.Background()
	reason := e.rt.Capabilities(ctx).CheckpointReason
	t.Logf("%s cannot checkpoint on this host: %s", e.rt.Name(), reason)
	if strings.TrimSpace(reason) == "" {
		t.Fatalf("%s reports no memory checkpoint without a reason", e.rt.Name())
	}
	src := e.start(t, boxOpts{script: idle})
	image := filepath.Join(e.base, src.id+"-mem")
	if err := e.rt.Checkpoint(ctx, src.id, image); !errs.Is(err, errs.FailedPrecondition) {
		t.Fatalf("Checkpoint on a host that cannot: %v, want failed_precondition", err)
	}
	if err := e.rt.Restore(ctx, src.spec, image); !errs.Is(err, errs.FailedPrecondition) {
		t.Fatalf("Restore on a host that cannot: %v, want failed_precondition", err)
	}
	if st, err := e.rt.State(ctx, src.id); err != nil || st.State != "running" {
		t.Fatalf("after refused Checkpoint: %+v, %v; want running, untouched", st, err)
	}
}

package fake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The fake passes the contract part of the conformance suite, as a
// backend that can checkpoint and as one that cannot.
func TestContract(t *testing.T) {
	runtimetest.RunContract(t, func(t *testing.T) runtime.Runtime { return fake.New(fake.Options{}) })
}

func TestContractNoCheckpoint(t *testing.T) {
	runtimetest.RunContract(t, func(t *testing.T) runtime.Runtime {
		return fake.New(fake.Options{NoCheckpoint: true, NoFreeze: true})
	})
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func spec(t *testing.T, id string) runtime.Spec {
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{ID: id, BundleDir: dir, RootFS: root, Args: []string{"/.berth/berth-agent"}}
}

// Memory survives a checkpoint as data, forks are independent, and CPU is
// the time run on the injected clock (not counting frozen time).
func TestMemoryAndClock(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var mu sync.Mutex
	booted := map[string]string{}
	stopped := map[string]int{}
	rt := fake.New(fake.Options{Now: clk.Now, Boot: func(ctx context.Context, s runtime.Spec, from *runtime.Spec) (func(), error) {
		mu.Lock()
		defer mu.Unlock()
		booted[s.ID] = ""
		if from != nil {
			booted[s.ID] = from.ID
		}
		return func() { mu.Lock(); stopped[s.ID]++; mu.Unlock() }, nil
	}})
	src := spec(t, "src")
	if err := rt.Run(ctx, src); err != nil {
		t.Fatal(err)
	}
	if err := rt.Run(ctx, src); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("second Run of one id: %v, want already_exists", err)
	}
	clk.Add(3 * time.Second)
	if err := rt.Freeze(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour) // frozen: no CPU
	st, err := rt.Stats(ctx, "src")
	if err != nil || st.CPUUsageNanos != uint64(3*time.Second) {
		t.Fatalf("Stats = %+v, %v; want 3s of CPU", st, err)
	}
	if err := rt.Thaw(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if err := rt.SetMemory("src", "counter", "41"); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "img")
	if err := rt.Checkpoint(ctx, "src", img); err != nil {
		t.Fatal(err)
	}
	if s, err := rt.State(ctx, "src"); err != nil || s.State != "stopped" {
		t.Fatalf("after Checkpoint: %+v, %v; want stopped", s, err)
	}
	if err := rt.SetMemory("src", "counter", "99"); err == nil {
		t.Fatal("a checkpointed container's memory changed")
	}
	for _, id := range []string{"kida", "kidb"} {
		if err := rt.Restore(ctx, spec(t, id), img); err != nil {
			t.Fatal(err)
		}
	}
	_ = rt.SetMemory("kida", "counter", "42")
	if v, _ := rt.Memory("kidb", "counter"); v != "41" {
		t.Errorf("kidb's counter = %q, want 41 from the image (independent of kida)", v)
	}
	bad := spec(t, "kidc")
	bad.Args = []string{"/bin/other"}
	if err := rt.Restore(ctx, bad, img); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("Restore with another PID 1: %v, want failed_precondition", err)
	}
	mu.Lock()
	if booted["kida"] != "src" || booted["kidb"] != "src" || stopped["src"] != 1 {
		t.Errorf("booted %v stopped %v; want kids restored from src, src stopped once", booted, stopped)
	}
	mu.Unlock()
	if err := rt.Delete(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if stopped["src"] != 1 {
		t.Errorf("Delete of a stopped container stopped its PID 1 again: %d", stopped["src"])
	}
	mu.Unlock()
}

func TestFaultsAndExit(t *testing.T) {
	ctx := context.Background()
	rt := fake.New(fake.Options{})
	boom := errs.E(errs.Internal, "boom")
	rt.FailNext(fake.OpRun, boom)
	if err := rt.Run(ctx, spec(t, "a")); !errors.Is(err, boom) {
		t.Fatalf("Run with an injected fault: %v", err)
	}
	if _, err := rt.State(ctx, "a"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("a failed Run left %v", err)
	}
	if err := rt.Run(ctx, spec(t, "a")); err != nil {
		t.Fatal(err)
	}
	if rt.Calls(fake.OpRun) != 2 {
		t.Errorf("Calls(run) = %d, want 2", rt.Calls(fake.OpRun))
	}
	if err := rt.Kill(ctx, "a", syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if s, _ := rt.State(ctx, "a"); s.State != "running" {
		t.Fatalf("SIGUSR1 stopped PID 1: %+v", s)
	}
	_ = rt.OOMKill("a")
	if st, _ := rt.Stats(ctx, "a"); st.OOMKills != 1 {
		t.Errorf("OOMKills = %d, want 1", st.OOMKills)
	}
	if err := rt.Exit("a"); err != nil {
		t.Fatal(err)
	}
	if s, _ := rt.State(ctx, "a"); s.State != "stopped" || s.Pid != 0 {
		t.Fatalf("after Exit: %+v, want stopped", s)
	}
	if err := rt.Kill(ctx, "a", syscall.SIGKILL); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("Kill of a stopped container: %v, want failed_precondition", err)
	}
	bootErr := errs.E(errs.Unavailable, "agent crashed")
	rt2 := fake.New(fake.Options{Boot: func(context.Context, runtime.Spec, *runtime.Spec) (func(), error) { return nil, bootErr }})
	if err := rt2.Run(ctx, spec(t, "b")); !errs.Is(err, errs.Unavailable) {
		t.Fatalf("Run whose PID 1 fails: %v, want its kind kept", err)
	}
	if l, _ := rt2.List(ctx); len(l) != 0 {
		t.Fatalf("a failed boot left %+v", l)
	}
}

func TestDirs(t *testing.T) {
	ctx := context.Background()
	var fs fake.Dirs
	lower := t.TempDir()
	dir := filepath.Join(t.TempDir(), "sb")
	if _, err := fs.Remount(ctx, dir, []string{lower}, nil); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Remount without a workspace: %v, want not_found", err)
	}
	if _, err := fs.Prepare(ctx, dir, []string{lower}, 1, nil); errs.FieldOf(err) != "disk_mib" {
		t.Fatalf("Prepare of a 1 MiB disk: %v, want a disk_mib error", err)
	}
	root, err := fs.Prepare(ctx, dir, []string{lower}, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		t.Fatalf("root %s: %v", root, err)
	}
	if _, ok := fs.Mounted(dir); !ok {
		t.Fatal("not mounted after Prepare")
	}
	if _, err := fs.Prepare(ctx, dir, []string{lower}, 64, nil); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("second Prepare: %v, want already_exists", err)
	}
	for i := 0; i < 2; i++ {
		if err := fs.Teardown(ctx, dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := fs.Mounted(dir); ok || fs.MountedCount() != 0 {
		t.Fatal("mounted after Teardown")
	}
	if _, err := fs.Remount(ctx, dir, []string{lower}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Remount(ctx, dir, []string{filepath.Join(lower, "missing")}, nil); !errs.Is(err, errs.FailedPrecondition) {
		t.Fatalf("Remount over a missing lower: %v", err)
	}
}

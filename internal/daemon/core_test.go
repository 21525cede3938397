package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/sandbox"
)

// These are unit tests of the lifecycle core (create, start, stop, delete,
// expiry, the watch, reconcile after a crash) over fakeNode: no root, no
// kernel, no sleeps; time moves only when the test moves it.

// assertGone checks that nothing of sandbox id is left on the host, once
// the background half of deletes has run.
func (n *fakeNode) assertGone(id string) {
	n.t.Helper()
	n.d.reclaimer.settle()
	if _, err := n.rt.State(context.Background(), id); !errs.Is(err, errs.NotFound) {
		n.t.Errorf("container %s still known to the runtime: %v", id, err)
	}
	if _, ok := n.fs.Mounted(n.d.SandboxDir(id)); ok {
		n.t.Errorf("root filesystem of %s still mounted", id)
	}
	if _, err := os.Lstat(n.d.SandboxDir(id)); err == nil {
		n.t.Errorf("directory of %s left behind", id)
	}
}

// assertHalted checks that id runs nothing but keeps its workspace.
func (n *fakeNode) assertHalted(id string) {
	n.t.Helper()
	if _, err := n.rt.State(context.Background(), id); !errs.Is(err, errs.NotFound) {
		n.t.Errorf("container %s still exists: %v", id, err)
	}
	if _, ok := n.fs.Mounted(n.d.SandboxDir(id)); ok {
		n.t.Errorf("root filesystem of %s still mounted", id)
	}
	if _, err := os.Stat(filepath.Join(n.d.SandboxDir(id), "disk.img")); err != nil {
		n.t.Errorf("workspace of %s lost: %v", id, err)
	}
}

func (n *fakeNode) assertRunning(id string) {
	n.t.Helper()
	ctx := context.Background()
	if sb := n.get(id); sb.State != sandbox.Running {
		n.t.Fatalf("%s is %s (%s: %s), want running", id, sb.State, sb.Reason, sb.Message)
	}
	if st, err := n.rt.State(ctx, id); err != nil || st.State != "running" {
		n.t.Fatalf("container %s: %+v, %v; want running", id, st, err)
	}
	if _, ok := n.fs.Mounted(n.d.SandboxDir(id)); !ok {
		n.t.Fatalf("root filesystem of %s not mounted", id)
	}
	cl, err := n.d.Agent(ctx, "", id)
	if err != nil {
		n.t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cl.WaitReady(wctx, 2*time.Millisecond); err != nil {
		n.t.Fatalf("agent of %s does not answer: %v", id, err)
	}
}

func TestCoreLifecycle(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice", TTL: time.Hour, Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if sb.State != sandbox.Running || !sb.StartedAt.Equal(n.clk.Now()) || !sb.ExpiresAt.Equal(n.clk.Now().Add(time.Hour)) {
		t.Fatalf("created %+v, want running, started now, expiring in an hour", sb)
	}
	n.assertRunning(id)
	spec, _ := n.rt.Spec(id)
	if spec.RootFS != filepath.Join(n.d.SandboxDir(id), "rootfs") || spec.Hostname != id || spec.Resources.MemoryBytes != 512<<20 {
		t.Errorf("spec %+v: want the prepared root, the id as hostname, the default 512 MiB", spec)
	}
	if _, err := n.d.Get(ctx, "bob", id); !errs.Is(err, errs.NotFound) {
		t.Errorf("another owner sees the sandbox: %v", err)
	}

	n.clk.Add(time.Minute)
	out, err := n.d.Stop(ctx, "alice", id, "alice", "stopped")
	if err != nil || out.State != sandbox.Stopped {
		t.Fatalf("Stop: %+v, %v", out, err)
	}
	n.assertHalted(id)
	if out, err := n.d.Stop(ctx, "alice", id, "alice", "stopped"); err != nil || out.State != sandbox.Stopped {
		t.Fatalf("second Stop: %+v, %v; want a no-op", out, err)
	}

	n.clk.Add(time.Minute)
	out, err = n.d.Start(ctx, "alice", id, "alice")
	if err != nil || !out.StartedAt.Equal(n.clk.Now()) {
		t.Fatalf("Start: %+v, %v", out, err)
	}
	n.assertRunning(id)
	if got := n.rt.Calls(fake.OpRun); got != 2 {
		t.Errorf("runtime Run called %d times, want 2 (create, start)", got)
	}

	if err := n.d.Delete(ctx, "bob", id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Delete by another owner: %v, want not_found", err)
	}
	if err := n.d.Delete(ctx, "alice", id); err != nil {
		t.Fatal(err)
	}
	n.assertGone(id)
	if _, err := n.d.Get(ctx, "alice", id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	want := []string{"created", "stopped", "started", "deleted"}
	if got := n.reasons(id); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// A create whose runtime start fails leaves a failed record and nothing
// on the host but the workspace; the error keeps a useful message.
func TestCoreCreateFailure(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	n.rt.FailNext(fake.OpRun, errs.E(errs.ResourceExhausted, "no pids left"))
	if _, err := n.d.Create(ctx, CreateRequest{Owner: "alice"}); err == nil {
		t.Fatal("Create succeeded with a failing runtime")
	}
	list, _, err := n.d.List(ctx, ListFilter{Owner: "alice"})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v; want the one failed sandbox", list, err)
	}
	sb := list[0]
	if sb.State != sandbox.Failed || sb.Reason != "create_failed" {
		t.Fatalf("%s is %s (%s), want failed with create_failed", sb.ID, sb.State, sb.Reason)
	}
	n.assertHalted(sb.ID)
	// Its workspace is intact: start boots it again.
	if _, err := n.d.Start(ctx, "alice", sb.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	n.assertRunning(sb.ID)

	// Bad requests name their field and touch nothing.
	for _, tc := range []struct {
		req   CreateRequest
		field string
	}{
		{CreateRequest{}, "owner"},
		{CreateRequest{Owner: "a", Template: "nosuch"}, "template"},
		{CreateRequest{Owner: "a", Runtime: "runc"}, "runtime"},
		{CreateRequest{Owner: "a", TTL: 48 * time.Hour}, "ttl"},
	} {
		if _, err := n.d.Create(ctx, tc.req); errs.FieldOf(err) != tc.field {
			t.Errorf("Create(%+v) = %v, want an error naming %s", tc.req, err, tc.field)
		}
	}
	if got := n.rt.Calls(fake.OpRun); got != 2 {
		t.Errorf("runtime Run called %d times, want 2", got)
	}
}

// Expiry runs on the injected clock: a sandbox past its TTL gets its
// expiry action; a lease holds it; an expired sandbox cannot be started.
func TestCoreExpiry(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	stop, err := n.d.Create(ctx, CreateRequest{Owner: "alice", TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	del, err := n.d.Create(ctx, CreateRequest{Owner: "alice", TTL: 10 * time.Minute, ExpiryAction: sandbox.ExpireDelete})
	if err != nil {
		t.Fatal(err)
	}
	leased, err := n.d.Create(ctx, CreateRequest{Owner: "alice", TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Lease(ctx, "alice", leased.ID, 30*time.Minute); err != nil {
		t.Fatal(err)
	}

	n.clk.Add(10*time.Minute - time.Second)
	n.d.watch.expireDue(ctx)
	for _, id := range []string{stop.ID, del.ID, leased.ID} {
		n.assertRunning(id)
	}

	n.clk.Add(time.Second)
	n.d.watch.expireDue(ctx)
	if sb := n.get(stop.ID); sb.State != sandbox.Stopped || sb.Reason != "expired" {
		t.Errorf("%s is %s (%s) at its expiry, want stopped: expired", stop.ID, sb.State, sb.Reason)
	}
	n.assertHalted(stop.ID)
	n.d.reclaimer.settle()
	if _, err := n.st.GetSandbox(ctx, del.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("sandbox with expiry action delete still stored: %v", err)
	}
	n.assertGone(del.ID)
	n.assertRunning(leased.ID) // the lease holds it

	if _, err := n.d.Start(ctx, "alice", stop.ID, "alice"); !errs.Is(err, errs.FailedPrecondition) {
		t.Errorf("Start of an expired sandbox: %v, want failed_precondition", err)
	}
	n.clk.Add(20 * time.Minute) // the lease ends
	n.d.watch.expireDue(ctx)
	if sb := n.get(leased.ID); sb.State != sandbox.Stopped {
		t.Errorf("leased sandbox is %s after its lease ended, want stopped", sb.State)
	}
	if _, err := n.d.SetExpiry(ctx, "alice", stop.ID, n.clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Start(ctx, "alice", stop.ID, "alice"); err != nil {
		t.Fatalf("Start after extending: %v", err)
	}
	n.assertRunning(stop.ID)
}

// The watch notices a PID 1 that died and OOM kills inside a sandbox.
func TestCoreWatch(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	n.d.watch.watchOne(ctx, sb)
	n.assertRunning(sb.ID)
	_ = n.rt.OOMKill(sb.ID)
	n.d.watch.watchOne(ctx, sb)
	if got := n.reasons(sb.ID); !slices.Contains(got, "oom_kill") {
		t.Errorf("no oom_kill event after an OOM kill: %v", got)
	}
	if err := n.rt.Exit(sb.ID); err != nil {
		t.Fatal(err)
	}
	n.d.watch.watchOne(ctx, sb)
	if got := n.get(sb.ID); got.State != sandbox.Failed || got.Reason != "exited" {
		t.Fatalf("%s is %s (%s) after its PID 1 exited, want failed: exited", sb.ID, got.State, got.Reason)
	}
	n.assertHalted(sb.ID)
}

// After a crash of the daemon, Reconcile adopts what still runs, finishes
// an interrupted create whose agent answers, fails what died or never
// booted, and removes what the store does not know.
func TestCoreReconcileAfterCrash(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	alive, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	died, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Stop(ctx, "alice", stopped.ID, "alice", "stopped"); err != nil {
		t.Fatal(err)
	}
	// A create that booted but crashed before its transition, and one that
	// crashed right after its intent was written.
	tpl, err := n.st.GetTemplate(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	booted := n.intent("alice")
	if err := n.d.boot(ctx, booted, &tpl); err != nil {
		t.Fatal(err)
	}
	intent := n.intent("alice")
	// An orphan container and an orphan directory nobody knows.
	orphanDir := n.d.SandboxDir("orphan1")
	if err := os.MkdirAll(orphanDir, 0o700); err != nil {
		t.Fatal(err)
	}
	orphan, _ := n.rt.Spec(alive.ID)
	orphan.ID, orphan.BundleDir = "orphan2", t.TempDir()
	if err := n.rt.Run(ctx, orphan); err != nil {
		t.Fatal(err)
	}

	n.crash()
	if err := n.rt.Exit(died.ID); err != nil { // died while the daemon was down
		t.Fatal(err)
	}
	n.clk.Add(time.Minute)
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}

	n.assertRunning(alive.ID)
	n.assertRunning(booted.ID)
	if got := n.get(booted.ID); got.Reason != "adopted" || !got.StartedAt.Equal(n.clk.Now()) {
		t.Errorf("interrupted create that booted: %s (%s), want adopted now", got.State, got.Reason)
	}
	for id, reason := range map[string]string{died.ID: "died_while_daemon_down", intent.ID: "create_interrupted"} {
		if got := n.get(id); got.State != sandbox.Failed || got.Reason != reason {
			t.Errorf("%s is %s (%s), want failed: %s", id, got.State, got.Reason, reason)
		}
		if _, err := n.rt.State(ctx, id); !errs.Is(err, errs.NotFound) {
			t.Errorf("container %s left: %v", id, err)
		}
	}
	if got := n.get(stopped.ID); got.State != sandbox.Stopped {
		t.Errorf("stopped sandbox is %s after Reconcile", got.State)
	}
	n.assertHalted(stopped.ID)
	if _, err := n.rt.State(ctx, "orphan2"); !errs.Is(err, errs.NotFound) {
		t.Errorf("orphan container kept: %v", err)
	}
	if _, err := os.Lstat(orphanDir); err == nil {
		t.Errorf("orphan directory kept")
	}
	// A second Reconcile finds nothing to do.
	runs := n.rt.Calls(fake.OpRun)
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n.rt.Calls(fake.OpRun) != runs || n.get(alive.ID).State != sandbox.Running {
		t.Errorf("a second Reconcile changed something")
	}
}

// intent writes a create's intent (a creating row) the way Create does.
func (n *fakeNode) intent(owner string) *sandbox.Sandbox {
	n.t.Helper()
	ctx := context.Background()
	req := CreateRequest{Owner: owner}
	tpl, err := n.d.normalize(ctx, &req)
	if err != nil {
		n.t.Fatal(err)
	}
	now := n.clk.Now()
	sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: owner, Template: tpl.Name, TemplateID: tpl.Fingerprint,
		Runtime: req.Runtime, State: sandbox.Creating, Labels: map[string]string{}, Resources: req.Resources,
		CreatedAt: now, ExpiresAt: now.Add(req.TTL), ExpiryAction: req.ExpiryAction,
		Attrs: checkpoint.WithPinnedLayers(sandbox.Attrs{}, tpl)}
	n.d.userns.preset(sb)
	if err := n.d.adm.Admit(ctx, sb); err != nil {
		n.t.Fatal(err)
	}
	return sb
}

// A PID 1 that starts but whose agent never answers fails the create
// within ReadyTimeout as unavailable, and nothing of it keeps running.
func TestCoreAgentNeverReady(t *testing.T) {
	n := newFakeNode(t, fake.Options{Boot: func(context.Context, runtime.Spec, *runtime.Spec) (func(), error) {
		return nil, nil // PID 1 runs, but no agent dials the channel
	}})
	n.d.Close()
	n.cfg.ReadyTimeout = 50 * time.Millisecond
	n.start()
	ctx := context.Background()
	_, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if !errs.Is(err, errs.Unavailable) {
		t.Fatalf("Create with a silent agent: %v, want unavailable", err)
	}
	list, _, _ := n.d.List(ctx, ListFilter{Owner: "alice"})
	if len(list) != 1 || list[0].State != sandbox.Failed {
		t.Fatalf("List = %+v, want one failed sandbox", list)
	}
	n.assertHalted(list[0].ID)
	if _, err := os.Lstat(n.d.chans.socketPath(list[0].ID)); err == nil {
		t.Errorf("channel socket of the failed sandbox left listening")
	}
}

// A sandbox recorded as deleted whose teardown did not finish (the daemon
// died mid-delete) is removed for good by Reconcile.
func TestCoreReconcileFinishesDelete(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Transition(ctx, sb.ID, sandbox.Deleted, "alice", "deleted", "", nil); err != nil {
		t.Fatal(err)
	}
	n.crash()
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.st.GetSandbox(ctx, sb.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("deleted sandbox still stored: %v", err)
	}
	n.assertGone(sb.ID)
}

package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// These are unit tests of the checkpoint services (internal/checkpoint:
// pause in every mode with its fallback, resume, fork, snapshots, layer
// pins) through the lifecycle core over fakeNode: the fake runtime's
// freeze, checkpoint and restore (its "memory" is what a checkpoint keeps),
// plain-directory workspaces, a real store and real in-process agents. No
// root, no kernel, no sleeps.

// events lists a sandbox's events, oldest first.
func (n *fakeNode) events(id string) []sandbox.Event {
	n.t.Helper()
	evs, err := n.st.ListEvents(context.Background(), store.EventFilter{SandboxID: id})
	if err != nil {
		n.t.Fatal(err)
	}
	return evs
}

// event finds the first event of id with type typ and reason.
func (n *fakeNode) event(id, typ, reason string) (sandbox.Event, bool) {
	n.t.Helper()
	for _, e := range n.events(id) {
		if e.Type == typ && e.Reason == reason {
			return e, true
		}
	}
	return sandbox.Event{}, false
}

// settle waits until no operation holds id's lock: after a memory pause,
// until the background release of its filesystem and network is done.
func (n *fakeNode) settle(id string) { n.d.Lock(id)() }

// health asks id's agent how it is (its restore count, as the daemon told it).
func (n *fakeNode) health(id string) agentapi.Health {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := n.d.Agent(ctx, "", id)
	if err != nil {
		n.t.Fatal(err)
	}
	h, err := cl.WaitReady(ctx, 2*time.Millisecond)
	if err != nil {
		n.t.Fatalf("agent of %s does not answer: %v", id, err)
	}
	return h
}

// memory reads key from the fake's memory of container id ("" if unset).
func (n *fakeNode) memory(id, key string) string {
	v, _ := n.rt.Memory(id, key)
	return v
}

// chanOpen reports whether the daemon listens on id's channel socket.
func (n *fakeNode) chanOpen(id string) bool {
	n.d.chans.mu.Lock()
	defer n.d.chans.mu.Unlock()
	_, ok := n.d.chans.m[id]
	return ok
}

func (n *fakeNode) create(owner string) *sandbox.Sandbox {
	n.t.Helper()
	sb, err := n.d.Create(context.Background(), CreateRequest{Owner: owner})
	if err != nil {
		n.t.Fatal(err)
	}
	return sb
}

func (n *fakeNode) setMemory(id, key, value string) {
	n.t.Helper()
	if err := n.rt.SetMemory(id, key, value); err != nil {
		n.t.Fatal(err)
	}
}

// writeUpper writes a file into id's workspace (its overlay upper), as a
// process inside would.
func (n *fakeNode) writeUpper(id, name, content string) {
	n.t.Helper()
	p := filepath.Join(rootfs.LayoutOf(n.d.SandboxDir(id)).Upper, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *fakeNode) readUpper(id, name string) string {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(rootfs.LayoutOf(n.d.SandboxDir(id)).Upper, name))
	if err != nil {
		n.t.Fatalf("workspace file %s of %s: %v", name, id, err)
	}
	return string(b)
}

func (n *fakeNode) containerState(id string) string {
	n.t.Helper()
	st, err := n.rt.State(context.Background(), id)
	if errs.Is(err, errs.NotFound) {
		return "none"
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return st.State
}

// A freeze pause freezes the container in place and a resume thaws it:
// the same processes (no boot, no checkpoint), their memory intact, and
// streams told the sandbox is pausing.
func TestCheckpointFreezeResume(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	id := n.create("alice").ID
	n.setMemory(id, "counter", "41")
	streams := ck.PauseSignal(id)

	if _, err := ck.Pause(ctx, "bob", id, sandbox.PauseFreeze); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Pause by another owner: %v, want not_found", err)
	}
	if _, err := ck.Pause(ctx, "alice", id, "hibernate"); errs.KindOf(err) != errs.InvalidArgument {
		t.Fatalf("Pause with an unknown mode: %v, want invalid_argument", err)
	}
	out, err := ck.Pause(ctx, "alice", id, sandbox.PauseFreeze)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Paused || out.PauseRequested != sandbox.PauseFreeze || out.PauseActual != sandbox.PauseFreeze {
		t.Fatalf("paused %s requested %q actual %q, want paused in freeze", out.State, out.PauseRequested, out.PauseActual)
	}
	if got := n.containerState(id); got != "paused" {
		t.Errorf("container is %s, want frozen (paused)", got)
	}
	if _, ok := n.fs.Mounted(n.d.SandboxDir(id)); !ok {
		t.Errorf("root filesystem unmounted by a freeze pause")
	}
	select {
	case <-streams:
	default:
		t.Errorf("open streams were not told of the pause")
	}
	if _, err := ck.Pause(ctx, "alice", id, sandbox.PauseFreeze); !errs.Is(err, errs.Conflict) {
		t.Errorf("second Pause: %v, want conflict", err)
	}

	n.clk.Add(time.Minute)
	out, err = ck.Resume(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseFreeze || out.RestoreCount != 0 {
		t.Fatalf("resumed %s from %q (%d restores), want running from freeze", out.State, out.ResumedFrom, out.RestoreCount)
	}
	n.assertRunning(id)
	if got := n.memory(id, "counter"); got != "41" {
		t.Errorf("memory after a thaw: %q, want 41", got)
	}
	for op, want := range map[fake.Op]int{fake.OpFreeze: 1, fake.OpThaw: 1, fake.OpRun: 1, fake.OpCheckpoint: 0, fake.OpRestore: 0} {
		if got := n.rt.Calls(op); got != want {
			t.Errorf("runtime %s called %d times, want %d", op, got, want)
		}
	}
	want := []string{"created", "paused", "paused", "resuming", "resumed"}
	if got := n.reasons(id); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if _, err := ck.Resume(ctx, "alice", id); !errs.Is(err, errs.Conflict) {
		t.Errorf("Resume of a running sandbox: %v, want conflict", err)
	}
}

// A memory pause checkpoints the container (its memory to an image, its
// processes, filesystem mount and channel gone) and a resume restores it:
// the memory survives, the agent is told its restore count, and each
// cycle counts.
func TestCheckpointMemoryResume(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	id := n.create("alice").ID
	n.setMemory(id, "counter", "41")
	n.writeUpper(id, "notes", "kept")

	for cycle := 1; cycle <= 2; cycle++ {
		out, err := ck.Pause(ctx, "alice", id, "") // the default: memory, the fake can checkpoint
		if err != nil {
			t.Fatal(err)
		}
		if out.State != sandbox.Paused || out.PauseRequested != sandbox.PauseMemory || out.PauseActual != sandbox.PauseMemory {
			t.Fatalf("cycle %d: paused %s requested %q actual %q, want paused in memory", cycle, out.State, out.PauseRequested, out.PauseActual)
		}
		n.settle(id)
		n.assertHalted(id) // processes and mount released, workspace kept
		if _, err := os.Stat(filepath.Join(ck.MemoryDir(id), fake.ImageFile)); err != nil {
			t.Fatalf("cycle %d: no memory image: %v", cycle, err)
		}
		if n.chanOpen(id) {
			t.Errorf("cycle %d: channel of a checkpointed sandbox still open", cycle)
		}

		n.clk.Add(time.Minute)
		out, err = ck.Resume(ctx, "alice", id)
		if err != nil {
			t.Fatal(err)
		}
		if out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseMemory || out.RestoreCount != cycle {
			t.Fatalf("cycle %d: resumed %s from %q (%d restores), want running from memory, %d restores",
				cycle, out.State, out.ResumedFrom, out.RestoreCount, cycle)
		}
		n.assertRunning(id)
		if got := n.memory(id, "counter"); got != "41" {
			t.Errorf("cycle %d: memory after a restore: %q, want 41", cycle, got)
		}
		if h := n.health(id); h.RestoreCount != cycle {
			t.Errorf("cycle %d: agent says restore count %d", cycle, h.RestoreCount)
		}
		if _, err := os.Stat(ck.MemoryDir(id)); err == nil {
			t.Errorf("cycle %d: memory image kept after the restore", cycle)
		}
		if got := n.rt.Calls(fake.OpCheckpoint); got != cycle {
			t.Errorf("cycle %d: runtime checkpoint called %d times", cycle, got)
		}
		if got := n.rt.Calls(fake.OpRestore); got != cycle {
			t.Errorf("cycle %d: runtime restore called %d times", cycle, got)
		}
		n.setMemory(id, "counter", "41") // a fresh write into the restored process
	}
	if got := n.rt.Calls(fake.OpRun); got != 1 {
		t.Errorf("runtime Run called %d times, want 1: no cold boot", got)
	}
	if got := n.readUpper(id, "notes"); got != "kept" {
		t.Errorf("workspace file: %q", got)
	}
	if _, ok := n.event(id, "pause_degraded", "fallback_to_disk"); ok {
		t.Errorf("a memory pause that worked says it degraded")
	}
}

// A disk pause stops the processes and keeps only the workspace; the
// resume is a cold boot from it: files kept, memory not.
func TestCheckpointDiskResume(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	id := n.create("alice").ID
	n.setMemory(id, "counter", "41")
	n.writeUpper(id, "notes", "kept")

	out, err := ck.Pause(ctx, "alice", id, sandbox.PauseDisk)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Paused || out.PauseActual != sandbox.PauseDisk {
		t.Fatalf("paused %s actual %q, want paused on disk", out.State, out.PauseActual)
	}
	n.assertHalted(id)
	if _, err := os.Stat(ck.MemoryDir(id)); err == nil {
		t.Errorf("a disk pause wrote a memory image")
	}

	out, err = ck.Resume(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseDisk || out.RestoreCount != 0 {
		t.Fatalf("resumed %s from %q (%d restores), want running from disk", out.State, out.ResumedFrom, out.RestoreCount)
	}
	n.assertRunning(id)
	if got := n.readUpper(id, "notes"); got != "kept" {
		t.Errorf("workspace file after a disk pause: %q", got)
	}
	if got, ok := n.rt.Memory(id, "counter"); ok {
		t.Errorf("memory survived a cold boot: %q", got)
	}
	for op, want := range map[fake.Op]int{fake.OpRun: 2, fake.OpCheckpoint: 0, fake.OpRestore: 0, fake.OpFreeze: 0} {
		if got := n.rt.Calls(op); got != want {
			t.Errorf("runtime %s called %d times, want %d", op, got, want)
		}
	}
	for _, typ := range []string{"pause_degraded", "resume_degraded"} {
		for _, e := range n.events(id) {
			if e.Type == typ {
				t.Errorf("a disk pause and resume as asked recorded %s: %+v", typ, e)
			}
		}
	}
}

// A memory checkpoint that fails falls back to a disk pause: the sandbox
// is paused (not failed), the event says what was asked, what was done and
// why, and the resume boots from disk.
func TestCheckpointMemoryFallsBackToDisk(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	id := n.create("alice").ID
	n.writeUpper(id, "notes", "kept")
	n.rt.FailNext(fake.OpCheckpoint, errs.E(errs.Internal, "criu dump: no space left on the image device"))

	out, err := ck.Pause(ctx, "alice", id, sandbox.PauseMemory)
	if err != nil {
		t.Fatalf("Pause with a failing checkpoint: %v, want the disk fallback", err)
	}
	if out.State != sandbox.Paused || out.PauseRequested != sandbox.PauseMemory || out.PauseActual != sandbox.PauseDisk {
		t.Fatalf("paused %s requested %q actual %q, want paused on disk for a memory request", out.State, out.PauseRequested, out.PauseActual)
	}
	if !strings.Contains(out.Message, "no space left") {
		t.Errorf("the pause's message %q does not say why", out.Message)
	}
	ev, ok := n.event(id, "pause_degraded", "fallback_to_disk")
	if !ok {
		t.Fatalf("no pause_degraded event: %v", n.reasons(id))
	}
	if ev.Data["requested"] != "memory" || ev.Data["actual"] != "disk" || !strings.Contains(ev.Message, "no space left") {
		t.Errorf("pause_degraded event %+v: want requested memory, actual disk, and the checkpoint's error", ev)
	}
	n.assertHalted(id)
	for _, dir := range []string{ck.MemoryDir(id), ck.MemoryDir(id) + ".tmp"} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s left by a failed checkpoint", dir)
		}
	}

	out, err = ck.Resume(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseDisk {
		t.Fatalf("resumed %s from %q, want running from disk", out.State, out.ResumedFrom)
	}
	n.assertRunning(id)
	if got := n.readUpper(id, "notes"); got != "kept" {
		t.Errorf("workspace file: %q", got)
	}
	if _, ok := n.event(id, "resume_degraded", "cold_boot"); ok {
		t.Errorf("a resume of a disk pause says it degraded")
	}
	if got := n.rt.Calls(fake.OpRestore); got != 0 {
		t.Errorf("runtime restore called %d times for a disk pause", got)
	}
}

// A runtime that cannot checkpoint here makes disk the default, and a
// memory pause asked for degrades to disk saying that is why.
func TestCheckpointMemoryUnsupported(t *testing.T) {
	n2 := newFakeNode(t, fake.Options{NoCheckpoint: true, CheckpointReason: "criu is not installed"})
	ctx := context.Background()
	id2 := n2.create("alice").ID
	if got := n2.d.Checkpoints().DefaultMode(n2.get(id2)); got != sandbox.PauseDisk {
		t.Errorf("default mode without checkpoints: %q, want disk", got)
	}
	out, err := n2.d.Checkpoints().Pause(ctx, "alice", id2, sandbox.PauseMemory)
	if err != nil || out.PauseActual != sandbox.PauseDisk {
		t.Fatalf("memory Pause without checkpoints: %+v, %v; want a disk pause", out, err)
	}
	if ev, ok := n2.event(id2, "pause_degraded", "fallback_to_disk"); !ok || !strings.Contains(ev.Message, "criu is not installed") {
		t.Errorf("pause_degraded event %+v (%v): want the runtime's reason", ev, ok)
	}
	if got := n2.rt.Calls(fake.OpCheckpoint); got != 0 {
		t.Errorf("checkpoint tried %d times on a runtime that cannot", got)
	}
}

// A memory image that cannot be restored is not the end: the resume boots
// from the workspace and says so (resume_degraded), the sandbox runs with
// its files but not its memory. A cold resume asked for does the same.
func TestCheckpointRestoreFailureBootsFromDisk(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	id := n.create("alice").ID
	n.setMemory(id, "counter", "41")
	n.writeUpper(id, "notes", "kept")
	if _, err := ck.Pause(ctx, "alice", id, sandbox.PauseMemory); err != nil {
		t.Fatal(err)
	}
	n.settle(id)
	n.rt.FailNext(fake.OpRestore, errs.E(errs.Internal, "criu restore: tcp socket in use"))

	out, err := ck.Resume(ctx, "alice", id)
	if err != nil {
		t.Fatalf("Resume with a failing restore: %v, want a cold boot", err)
	}
	if out.State != sandbox.Running || out.ResumedFrom != sandbox.PauseDisk || out.RestoreCount != 0 {
		t.Fatalf("resumed %s from %q (%d restores), want running from disk", out.State, out.ResumedFrom, out.RestoreCount)
	}
	ev, ok := n.event(id, "resume_degraded", "cold_boot")
	if !ok {
		t.Fatalf("no resume_degraded event: %v", n.reasons(id))
	}
	if ev.Data["paused_with"] != "memory" || ev.Data["resumed_from"] != "disk" || !strings.Contains(ev.Message, "tcp socket in use") {
		t.Errorf("resume_degraded event %+v: want paused_with memory, resumed_from disk, and the restore's error", ev)
	}
	n.assertRunning(id)
	if got, ok := n.rt.Memory(id, "counter"); ok {
		t.Errorf("memory %q after a cold boot", got)
	}
	if got := n.readUpper(id, "notes"); got != "kept" {
		t.Errorf("workspace file: %q", got)
	}
	if got := n.rt.Calls(fake.OpRun); got != 2 {
		t.Errorf("runtime Run called %d times, want 2 (create, the cold boot)", got)
	}
	if _, err := os.Stat(ck.MemoryDir(id)); err == nil {
		t.Errorf("the memory image that failed is kept")
	}

	// A cold resume ignores a good image, and says so.
	n.setMemory(id, "counter", "42")
	if _, err := ck.Pause(ctx, "alice", id, sandbox.PauseMemory); err != nil {
		t.Fatal(err)
	}
	n.settle(id)
	out, err = ck.ResumeCold(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if out.ResumedFrom != sandbox.PauseDisk || n.rt.Calls(fake.OpRestore) != 1 {
		t.Errorf("cold resume from %q with %d restores, want disk without a restore", out.ResumedFrom, n.rt.Calls(fake.OpRestore))
	}
	if got, ok := n.rt.Memory(id, "counter"); ok {
		t.Errorf("memory %q after a cold resume", got)
	}
	if evs := n.events(id); evs[len(evs)-2].Type != "resume_degraded" || !strings.Contains(evs[len(evs)-2].Message, "cold resume requested") {
		t.Errorf("cold resume recorded %+v, want a resume_degraded saying it was asked for", evs[len(evs)-2])
	}
	n.assertRunning(id)
}

// A memory fork of a running sandbox: one checkpoint, the parent restored
// from it and running on, three children restored from the same image,
// each with its lineage, its own identity and its own copy of the memory.
func TestCheckpointForkMemory(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	parent := n.create("alice")
	n.setMemory(parent.ID, "counter", "7")
	n.writeUpper(parent.ID, "notes", "parent's")

	if _, err := ck.Fork(ctx, "alice", parent.ID, "alice", 0); errs.FieldOf(err) != "count" {
		t.Fatalf("Fork of 0: %v, want an error naming count", err)
	}
	if _, err := ck.Fork(ctx, "bob", parent.ID, "bob", 1); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Fork by another owner: %v, want not_found", err)
	}
	res, err := ck.Fork(ctx, "alice", parent.ID, "alice", 3)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != checkpoint.ForkMemory || res.Reason != "" || res.Parent != parent.ID || len(res.Sandboxes) != 3 {
		t.Fatalf("fork %+v: want 3 children in memory mode", res)
	}
	sn, err := n.d.Snapshots().GetSnapshot(ctx, "alice", res.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if sn.SourceSandbox != parent.ID || sn.MemoryPath == "" {
		t.Errorf("fork snapshot %+v: want the parent's, with a memory image", sn)
	}

	// The parent runs on from the image: same memory, one restore.
	n.assertRunning(parent.ID)
	if got := n.get(parent.ID); got.RestoreCount != 1 || got.State != sandbox.Running {
		t.Errorf("parent %s after the fork: %d restores", got.State, got.RestoreCount)
	}
	if got := n.memory(parent.ID, "counter"); got != "7" {
		t.Errorf("parent's memory after the fork: %q, want 7", got)
	}
	if _, ok := n.event(parent.ID, "fork", "forked"); !ok {
		t.Errorf("no fork event on the parent: %v", n.reasons(parent.ID))
	}

	seen := map[string]bool{parent.ID: true}
	for i, c := range res.Sandboxes {
		if seen[c.ID] {
			t.Fatalf("child %d has a duplicate id %s", i, c.ID)
		}
		seen[c.ID] = true
		got := n.get(c.ID)
		want := sandbox.Lineage{Parent: parent.ID, Generation: 1, ForkMode: checkpoint.ForkMemory, Snapshot: sn.ID}
		if got.Lineage != want {
			t.Errorf("child %d lineage %+v, want %+v", i, got.Lineage, want)
		}
		if got.RestoreCount != 1 || got.Owner != "alice" || !slices.Equal(got.Layers, sn.Layers) {
			t.Errorf("child %d: %d restores, owner %s, layers %v; want 1, alice, the snapshot's %v", i, got.RestoreCount, got.Owner, got.Layers, sn.Layers)
		}
		n.assertRunning(c.ID) // its agent answers on its own channel, with its own key
		if h := n.health(c.ID); h.RestoreCount != 1 {
			t.Errorf("child %d's agent says restore count %d", i, h.RestoreCount)
		}
		if got := n.memory(c.ID, "counter"); got != "7" {
			t.Errorf("child %d's memory: %q, want the parent's 7", i, got)
		}
		if spec, _ := n.rt.Spec(c.ID); spec.Hostname != c.ID || spec.BundleDir != n.d.SandboxDir(c.ID) {
			t.Errorf("child %d runs with hostname %q in %s, want its own", i, spec.Hostname, spec.BundleDir)
		}
		lowers, _ := n.fs.Mounted(n.d.SandboxDir(c.ID))
		if len(lowers) == 0 || lowers[0] != n.tpl.LayerPath(sn.Layers[0]) {
			t.Errorf("child %d mounted over %v, want the snapshot's layer first", i, lowers)
		}
		if b, err := os.ReadFile(filepath.Join(lowers[0], "notes")); err != nil || string(b) != "parent's" {
			t.Errorf("child %d's lower holds %q, %v; want the parent's file", i, b, err)
		}
		if _, ok := n.event(c.ID, "fork", "forked"); !ok {
			t.Errorf("child %d has no fork event: %v", i, n.reasons(c.ID))
		}
	}
	for op, want := range map[fake.Op]int{fake.OpCheckpoint: 1, fake.OpRestore: 4, fake.OpRun: 1} {
		if got := n.rt.Calls(op); got != want {
			t.Errorf("runtime %s called %d times, want %d (one capture, parent + 3 restores)", op, got, want)
		}
	}

	// Their memories are their own.
	a, b := res.Sandboxes[0].ID, res.Sandboxes[1].ID
	n.setMemory(a, "counter", "100")
	n.setMemory(parent.ID, "counter", "8")
	if n.memory(a, "counter") != "100" || n.memory(b, "counter") != "7" || n.memory(res.Sandboxes[2].ID, "counter") != "7" {
		t.Errorf("a write to one child's or the parent's memory reached another: %q %q %q",
			n.memory(a, "counter"), n.memory(b, "counter"), n.memory(res.Sandboxes[2].ID, "counter"))
	}

	// A fork of a fork is generation 2, from the child's own memory.
	res2, err := ck.Fork(ctx, "alice", a, "alice", 1)
	if err != nil {
		t.Fatal(err)
	}
	g := n.get(res2.Sandboxes[0].ID)
	if g.Lineage.Parent != a || g.Lineage.Generation != 2 || g.Lineage.ForkMode != checkpoint.ForkMemory {
		t.Errorf("grandchild lineage %+v, want parent %s, generation 2, memory", g.Lineage, a)
	}
	if got := n.memory(g.ID, "counter"); got != "100" {
		t.Errorf("grandchild's memory %q, want its parent's 100", got)
	}
	n.assertRunning(g.ID)

	// The snapshot is in use by the children.
	if err := n.d.Snapshots().DeleteSnapshot(ctx, "alice", sn.ID); !errs.Is(err, errs.Conflict) {
		t.Errorf("DeleteSnapshot of a snapshot the children use: %v, want conflict", err)
	}
}

// A child whose restore fails boots from the snapshot's files instead:
// fork_mode disk, an honest reason, the other children unaffected.
func TestCheckpointForkChildRestoreFails(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	parent := n.create("alice")
	n.setMemory(parent.ID, "counter", "7")
	// Restores run parent first, then the children.
	n.rt.FailNext(fake.OpRestore, nil)
	n.rt.FailNext(fake.OpRestore, errs.E(errs.Internal, "criu restore: pid in use"))
	res, err := n.d.Checkpoints().Fork(ctx, "alice", parent.ID, "alice", 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != checkpoint.ForkMemory || len(res.Sandboxes) != 2 {
		t.Fatalf("fork %+v: want 2 children of a memory fork", res)
	}
	var modes []string
	for _, c := range res.Sandboxes {
		got := n.get(c.ID)
		modes = append(modes, got.Lineage.ForkMode)
		n.assertRunning(c.ID)
		if got.Lineage.ForkMode == checkpoint.ForkDisk {
			if !strings.Contains(got.Message, "pid in use") {
				t.Errorf("disk child's message %q does not say why", got.Message)
			}
			if _, ok := n.rt.Memory(c.ID, "counter"); ok {
				t.Errorf("a child booted from files has the parent's memory")
			}
		} else if n.memory(c.ID, "counter") != "7" {
			t.Errorf("memory child lost the parent's memory")
		}
	}
	slices.Sort(modes)
	if !slices.Equal(modes, []string{checkpoint.ForkDisk, checkpoint.ForkMemory}) {
		t.Errorf("children's fork modes %v, want one disk (its restore failed), one memory", modes)
	}
	n.assertRunning(parent.ID)
}

// Only a running sandbox can be forked: a paused one is refused (409,
// saying it is paused) and stays paused and resumable, nothing captured.
func TestCheckpointForkPaused(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ck := n.d.Checkpoints()
	frozen, mem := n.create("alice"), n.create("alice")
	n.setMemory(mem.ID, "counter", "7")
	if _, err := ck.Pause(ctx, "alice", frozen.ID, sandbox.PauseFreeze); err != nil {
		t.Fatal(err)
	}
	if _, err := ck.Pause(ctx, "alice", mem.ID, sandbox.PauseMemory); err != nil {
		t.Fatal(err)
	}
	n.settle(mem.ID)
	for _, id := range []string{frozen.ID, mem.ID} {
		_, err := ck.Fork(ctx, "alice", id, "alice", 1)
		if !errs.Is(err, errs.Conflict) || !strings.Contains(err.Error(), "paused") {
			t.Errorf("Fork of paused %s: %v, want a conflict saying it is paused", id, err)
		}
		if got := n.get(id); got.State != sandbox.Paused {
			t.Errorf("%s is %s after a refused fork", id, got.State)
		}
	}
	if sns, err := n.d.Snapshots().ListSnapshots(ctx, "alice"); err != nil || len(sns) != 0 {
		t.Errorf("snapshots after refused forks: %v, %v", sns, err)
	}
	if got := n.rt.Calls(fake.OpCheckpoint); got != 1 {
		t.Errorf("runtime checkpoint called %d times, want 1 (the memory pause)", got)
	}
	if got := n.containerState(frozen.ID); got != "paused" {
		t.Errorf("frozen container is %s after a refused fork", got)
	}
	for _, id := range []string{frozen.ID, mem.ID} {
		if _, err := ck.Resume(ctx, "alice", id); err != nil {
			t.Fatal(err)
		}
		n.assertRunning(id)
	}
	if got := n.memory(mem.ID, "counter"); got != "7" {
		t.Errorf("memory after a refused fork and a resume: %q", got)
	}
}

// A snapshot captures a running sandbox's workspace as a layer (frozen for
// the copy, running after); a create from it boots on the snapshot's
// layers and keeps them pinned for life, across a rebuild of its template.
func TestCheckpointSnapshotCreate(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	snaps := n.d.Snapshots()
	src := n.create("alice")
	n.writeUpper(src.ID, "notes", "from the source")
	tpl, err := n.st.GetTemplate(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}

	sn, err := snaps.Snapshot(ctx, checkpoint.SnapshotRequest{Owner: "alice", Actor: "alice", ID: src.ID, Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if sn.SourceSandbox != src.ID || sn.Template != "default" || sn.MemoryPath != "" || len(sn.Layers) != len(tpl.Layers)+1 ||
		!slices.Equal(sn.Layers[1:], tpl.Layers) {
		t.Fatalf("snapshot %+v: want a new layer over the template's %v", sn, tpl.Layers)
	}
	if b, err := os.ReadFile(filepath.Join(n.tpl.LayerPath(sn.Layers[0]), "notes")); err != nil || string(b) != "from the source" {
		t.Errorf("snapshot layer holds %q, %v; want the source's file", b, err)
	}
	n.assertRunning(src.ID)
	if n.rt.Calls(fake.OpFreeze) != 1 || n.rt.Calls(fake.OpThaw) != 1 {
		t.Errorf("snapshot froze %d and thawed %d times, want once each", n.rt.Calls(fake.OpFreeze), n.rt.Calls(fake.OpThaw))
	}
	if _, ok := n.event(src.ID, "snapshot", "snapshot_taken"); !ok {
		t.Errorf("no snapshot_taken event: %v", n.reasons(src.ID))
	}
	if _, err := snaps.Snapshot(ctx, checkpoint.SnapshotRequest{Owner: "alice", Actor: "alice", ID: src.ID, Name: "base"}); errs.FieldOf(err) != "name" {
		t.Errorf("a second snapshot named base: %v, want an error naming name", err)
	}

	child, err := n.d.Create(ctx, CreateRequest{Owner: "alice", FromSnapshot: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(child.Layers, sn.Layers) || child.Lineage.Snapshot != sn.ID || child.Template != "default" {
		t.Fatalf("child layers %v, snapshot %q, template %s; want the snapshot's %v", child.Layers, child.Lineage.Snapshot, child.Template, sn.Layers)
	}
	n.assertRunning(child.ID)
	var want []string
	for _, dg := range sn.Layers {
		want = append(want, n.tpl.LayerPath(dg))
	}
	if lowers, _ := n.fs.Mounted(n.d.SandboxDir(child.ID)); !slices.Equal(lowers, want) {
		t.Errorf("child mounted over %v, want the snapshot's layers %v", lowers, want)
	}
	if _, err := n.d.Create(ctx, CreateRequest{Owner: "bob", FromSnapshot: sn.ID}); errs.FieldOf(err) != "from_snapshot" {
		t.Errorf("create from another owner's snapshot: %v, want an error naming from_snapshot", err)
	}

	// The template is rebuilt on another layer: the child still boots on
	// the snapshot's, after a disk pause as after a stop.
	newLayer := strings.Repeat("ab", 32)
	if err := os.MkdirAll(n.tpl.LayerPath(newLayer), 0o755); err != nil {
		t.Fatal(err)
	}
	tpl.Layers, tpl.Fingerprint = []string{newLayer}, "rebuilt"
	if _, err := n.st.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Checkpoints().Pause(ctx, "alice", child.ID, sandbox.PauseDisk); err != nil {
		t.Fatal(err)
	}
	if _, err := n.d.Checkpoints().Resume(ctx, "alice", child.ID); err != nil {
		t.Fatal(err)
	}
	if lowers, _ := n.fs.Mounted(n.d.SandboxDir(child.ID)); !slices.Equal(lowers, want) {
		t.Errorf("child resumed over %v after a template rebuild, want its pinned %v", lowers, want)
	}
	if got := n.get(child.ID); !slices.Equal(got.Layers, sn.Layers) {
		t.Errorf("child's pin moved to %v", got.Layers)
	}

	if err := snaps.DeleteSnapshot(ctx, "alice", sn.ID); !errs.Is(err, errs.Conflict) {
		t.Errorf("DeleteSnapshot in use: %v, want conflict", err)
	}
	if err := n.d.Delete(ctx, "alice", child.ID); err != nil {
		t.Fatal(err)
	}
	n.d.reclaimer.settle() // the child's row pins the layer until its teardown ends
	if err := snaps.DeleteSnapshot(ctx, "alice", sn.ID); err != nil {
		t.Fatalf("DeleteSnapshot once unused: %v", err)
	}
	if _, err := os.Stat(n.tpl.LayerPath(sn.Layers[0])); err == nil {
		t.Errorf("the snapshot's own layer is kept after its delete")
	}
	if _, err := os.Stat(n.tpl.LayerPath(tpl.Layers[0])); err != nil {
		t.Errorf("the template's layer was removed with the snapshot: %v", err)
	}
}

// A daemon crash while sandboxes are paused in each mode: Reconcile keeps
// them paused as they were (the frozen processes, the memory image, the
// workspace), and each resumes as it would have.
func TestCheckpointCrashWhilePaused(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	modes := []sandbox.PauseMode{sandbox.PauseFreeze, sandbox.PauseMemory, sandbox.PauseDisk}
	ids := map[sandbox.PauseMode]string{}
	for _, m := range modes {
		id := n.create("alice").ID
		ids[m] = id
		n.setMemory(id, "counter", string(m))
		n.writeUpper(id, "notes", string(m))
		if _, err := n.d.Checkpoints().Pause(ctx, "alice", id, m); err != nil {
			t.Fatal(err)
		}
		n.settle(id)
	}

	n.crash()
	n.clk.Add(time.Minute)
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	for _, m := range modes {
		got := n.get(ids[m])
		if got.State != sandbox.Paused || got.PauseActual != m {
			t.Errorf("%s pause after a crash: %s (%s, actual %q)", m, got.State, got.Reason, got.PauseActual)
		}
	}
	if got := n.containerState(ids[sandbox.PauseFreeze]); got != "paused" {
		t.Errorf("frozen container is %s after Reconcile, want still frozen", got)
	}
	if _, err := os.Stat(filepath.Join(n.d.Checkpoints().MemoryDir(ids[sandbox.PauseMemory]), fake.ImageFile)); err != nil {
		t.Errorf("memory image lost in the crash: %v", err)
	}
	n.assertHalted(ids[sandbox.PauseMemory])
	n.assertHalted(ids[sandbox.PauseDisk])
	if _, ok := n.event(ids[sandbox.PauseFreeze], "pause_degraded", "freeze_lost"); ok {
		t.Errorf("a live frozen sandbox was recorded as lost")
	}

	for _, m := range modes {
		out, err := n.d.Checkpoints().Resume(ctx, "alice", ids[m])
		if err != nil {
			t.Fatalf("Resume of the %s pause after a crash: %v", m, err)
		}
		if out.ResumedFrom != m {
			t.Errorf("%s pause resumed from %q", m, out.ResumedFrom)
		}
		n.assertRunning(ids[m])
		if got := n.readUpper(ids[m], "notes"); got != string(m) {
			t.Errorf("%s pause: workspace file %q", m, got)
		}
	}
	if n.memory(ids[sandbox.PauseFreeze], "counter") != "freeze" || n.memory(ids[sandbox.PauseMemory], "counter") != "memory" {
		t.Errorf("memory lost across the crash: freeze %q, memory %q",
			n.memory(ids[sandbox.PauseFreeze], "counter"), n.memory(ids[sandbox.PauseMemory], "counter"))
	}
	if _, ok := n.rt.Memory(ids[sandbox.PauseDisk], "counter"); ok {
		t.Errorf("a disk pause kept its memory")
	}

	// A frozen sandbox whose processes died while the daemon was down is
	// settled as a disk pause, with an event saying so.
	id := ids[sandbox.PauseFreeze]
	if _, err := n.d.Checkpoints().Pause(ctx, "alice", id, sandbox.PauseFreeze); err != nil {
		t.Fatal(err)
	}
	n.crash()
	if err := n.rt.Exit(id); err != nil {
		t.Fatal(err)
	}
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.get(id); got.State != sandbox.Paused || got.PauseActual != sandbox.PauseDisk {
		t.Errorf("lost freeze: %s actual %q, want paused on disk", got.State, got.PauseActual)
	}
	if _, ok := n.event(id, "pause_degraded", "freeze_lost"); !ok {
		t.Errorf("no freeze_lost event: %v", n.reasons(id))
	}
	if _, err := n.d.Checkpoints().Resume(ctx, "alice", id); err != nil {
		t.Fatal(err)
	}
	n.assertRunning(id)
	if got := n.readUpper(id, "notes"); got != "freeze" {
		t.Errorf("workspace file after a lost freeze: %q", got)
	}
}

package daemon

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/sandbox"
)

// stalledFS is the fake filesystem whose Teardown of one sandbox dir
// does not return until its context ends: a delete's background half that
// a crash interrupts.
type stalledFS struct {
	*fake.Dirs
	mu      sync.Mutex
	dir     string
	entered chan struct{}
}

func (f *stalledFS) stall(dir string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dir, f.entered = dir, make(chan struct{})
	return f.entered
}

func (f *stalledFS) Teardown(ctx context.Context, dir string) error {
	f.mu.Lock()
	stall := dir == f.dir
	if stall {
		f.dir = ""
		close(f.entered)
	}
	f.mu.Unlock()
	if stall {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.Dirs.Teardown(ctx, dir)
}

// A delete answers with the sandbox recorded as deleted and its processes
// gone, before the rest of its teardown; a daemon that dies before that
// teardown ends leaves a deleted row, and the next start's Reconcile
// removes every trace. Close drains what is queued.
func TestDeleteAnswersBeforeTeardown(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	fs := &stalledFS{Dirs: n.fs}
	n.d.Close()
	n.cfg.Filesystem = fs
	n.start()
	ctx := context.Background()
	sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	entered := fs.stall(n.d.SandboxDir(sb.ID))
	if err := n.d.Delete(ctx, "alice", sb.ID); err != nil {
		t.Fatal(err)
	}
	// Answered: the processes are gone, the intent is durable, the
	// sandbox is invisible.
	if _, err := n.rt.State(ctx, sb.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("container %s runs after Delete answered: %v", sb.ID, err)
	}
	if got, err := n.st.GetSandbox(ctx, sb.ID); err != nil || got.State != sandbox.Deleted {
		t.Fatalf("row after Delete answered: %+v, %v; want deleted", got, err)
	}
	if _, err := n.d.Get(ctx, "alice", sb.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("Get after Delete: %v, want not_found", err)
	}
	if err := n.d.Delete(ctx, "alice", sb.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("second Delete: %v, want not_found", err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the background teardown never reached the filesystem")
	}

	n.crash() // kill -9 between the answer and the end of the teardown
	if _, ok := n.fs.Mounted(n.d.SandboxDir(sb.ID)); !ok {
		t.Fatal("the crash did not interrupt the teardown: nothing was left to reconcile")
	}
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.st.GetSandbox(ctx, sb.ID); !errs.Is(err, errs.NotFound) {
		t.Errorf("deleted row kept after Reconcile: %v", err)
	}
	n.assertGone(sb.ID)

	// Close waits for the teardowns already answered.
	var ids []string
	for range 3 {
		sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		if err := n.d.Delete(ctx, "alice", id); err != nil {
			t.Fatal(err)
		}
	}
	n.d.Close()
	for _, id := range ids {
		if _, err := n.st.GetSandbox(ctx, id); !errs.Is(err, errs.NotFound) {
			t.Errorf("%s: row kept after Close: %v", id, err)
		}
		if _, err := os.Lstat(n.d.SandboxDir(id)); err == nil {
			t.Errorf("%s: directory kept after Close", id)
		}
	}
	n.start() // the cleanup closes a daemon
}

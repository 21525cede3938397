package network

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
)

// holdAt makes outsideLock block at stage for id until the returned release
// is called; reached is closed when it gets there.
func holdAt(t *testing.T, stage, id string) (reached <-chan struct{}, release func()) {
	t.Helper()
	at, gate := make(chan struct{}), make(chan struct{})
	var once, rel sync.Once
	outsideLock = func(s, i string) {
		if s == stage && i == id {
			once.Do(func() { close(at) })
			<-gate
		}
	}
	release = func() { rel.Do(func() { close(gate) }) }
	t.Cleanup(func() { release(); outsideLock = func(string, string) {} })
	return at, release
}

func waitFor(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// A detach removes its veth and namespace without the manager's lock:
// another sandbox attaches meanwhile (a create beside a delete's
// teardown), but neither its address nor its id is reused until they are
// gone.
func TestDetachUnlinksOutsideTheLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held := e.attach("unlink1", egress.Policy{Mode: egress.DenyAll})
	reached, release := holdAt(t, "unlinking", "unlink1")
	detached := make(chan error, 1)
	go func() { detached <- e.mgr.Detach(ctx, "unlink1") }()
	waitFor(t, "the detach to reach its unlinking", reached)

	other := make(chan Attachment, 1)
	go func() { other <- e.attach("unlink2", egress.Policy{Mode: egress.DenyAll}) }()
	var att2 Attachment
	select {
	case att2 = <-other:
	case <-time.After(15 * time.Second):
		t.Fatal("an attach of another sandbox waited for a detach's unlinking")
	}
	if _, ok := e.mgr.Get("unlink1"); ok {
		t.Error("Get still sees a detached sandbox")
	}
	if att2.IP == held.IP {
		t.Errorf("unlink2 got %s while unlink1's veth still holds it", att2.IP)
	}
	if _, err := os.Stat(held.NetNSPath); err != nil {
		t.Fatalf("unlink1's namespace went before its unlinking: %v", err)
	}

	again := make(chan error, 1)
	go func() {
		_, err := e.mgr.Attach(ctx, "unlink1", egress.Policy{Mode: egress.DenyAll})
		again <- err
	}()
	select {
	case err := <-again:
		t.Fatalf("unlink1 attached again before its old namespace was gone: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	must(t, <-detached)
	must(t, <-again)
	att1, ok := e.mgr.Get("unlink1")
	if !ok || att1.IP != held.IP {
		t.Errorf("unlink1 attached again with %+v (%v), want its address %s back", att1, ok, held.IP)
	}
	if _, err := os.Stat(att1.NetNSPath); err != nil {
		t.Errorf("unlink1's new namespace: %v", err)
	}
	// Both are enforced as any attachment is: a fresh ruleset load agrees.
	must(t, e.mgr.Reconcile(ctx, []string{"unlink1", "unlink2"}))
	for _, id := range []string{"unlink1", "unlink2"} {
		must(t, e.mgr.Detach(ctx, id))
	}
}

// An attach makes its namespace and veth without the lock; until it has,
// Get does not see it and a whole ruleset does not render it (its delta
// adds it), while other attaches and lookups go on.
func TestAttachLinksOutsideTheLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	reached, release := holdAt(t, "attaching", "link1")
	done := make(chan error, 1)
	go func() {
		_, err := e.mgr.Attach(ctx, "link1", egress.Policy{Mode: egress.AllowAll})
		done <- err
	}()
	waitFor(t, "the attach to reach its linking", reached)
	other := make(chan Attachment, 1)
	go func() { other <- e.attach("link2", egress.Policy{Mode: egress.DenyAll}) }()
	select {
	case <-other:
	case <-time.After(15 * time.Second):
		t.Fatal("an attach of another sandbox waited for one still linking")
	}
	if _, ok := e.mgr.Get("link1"); ok {
		t.Error("Get sees a sandbox still attaching")
	}
	e.mgr.mu.Lock()
	script, err := e.mgr.planLocked()
	e.mgr.mu.Unlock()
	must(t, err)
	if strings.Contains(script, "link1") {
		t.Error("a whole ruleset renders a sandbox still attaching")
	}
	release()
	must(t, <-done)
	if _, ok := e.mgr.Get("link1"); !ok {
		t.Error("link1 not attached after its attach returned")
	}
	e.mgr.mu.Lock()
	script, err = e.mgr.planLocked()
	e.mgr.mu.Unlock()
	must(t, err)
	if !strings.Contains(script, "link1") {
		t.Error("the ruleset does not render link1 once attached")
	}
	for _, id := range []string{"link1", "link2"} {
		must(t, e.mgr.Detach(ctx, id))
	}
}

package effects

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// gatedStore is a real SQLite store whose WriteEffects (the committer's
// one write) can be held and made to fail, and which records the size of
// every commit.
type gatedStore struct {
	store.Store
	mu      sync.Mutex
	gate    chan struct{} // non-nil: commits wait until it is closed
	fail    error         // the next commit fails with it
	batches []int
}

func (g *gatedStore) WriteEffects(ctx context.Context, ws []store.EffectWrite) ([]error, error) {
	g.mu.Lock()
	gate := g.gate
	g.batches = append(g.batches, len(ws))
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	g.mu.Lock()
	fail := g.fail
	g.fail = nil // one commit fails
	g.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	return g.Store.WriteEffects(ctx, ws)
}

func (g *gatedStore) hold() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	return g.gate
}

func (g *gatedStore) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
}

func (g *gatedStore) commits() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.batches...)
}

func newGated(t *testing.T, ids ...string) (*Service, *gatedStore) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, id := range ids {
		if err := st.CreateSandbox(t.Context(), &sandbox.Sandbox{ID: id, Owner: "alice", Template: "t", TemplateID: "sha256:aa",
			Runtime: "runc", State: sandbox.Creating, Resources: sandbox.Resources{CPUMillis: 100, MemoryMiB: 64, DiskMiB: 64, Pids: 16},
			CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), ExpiryAction: sandbox.ExpireStop}); err != nil {
			t.Fatal(err)
		}
	}
	g := &gatedStore{Store: st}
	c := &clock{now: t0}
	l := New(storeCore{g}, Config{Now: c.Now})
	t.Cleanup(func() { g.open(); _ = l.Flush(context.Background()) })
	return l, g
}

// queued waits until n writes wait for the next commit.
func queued(t *testing.T, l *Service, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		l.w.mu.Lock()
		q := len(l.w.queue)
		l.w.mu.Unlock()
		if q >= n {
			return
		}
	}
	t.Fatalf("fewer than %d writes queued", n)
}

// The outcome is not waited for, but the effect stays in flight until it
// is stored: a repeat meanwhile waits and is answered from it; a listing
// shows it; a crash before the commit leaves the intent pending (unknown).
func TestFinishDoesNotWaitForItsCommit(t *testing.T) {
	l, g := newGated(t, "a")
	ctx := t.Context()
	tk := sent(t, l, post("a", "k1", "b"))
	g.hold()
	done := make(chan struct{})
	go func() {
		l.Finish(ctx, tk.Effect, egress.Outcome{Status: 201, Body: []byte("ok"), Complete: true, Size: 2})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Finish waited for the outcome's commit")
	}
	if e, err := g.Store.GetEffect(ctx, tk.Effect); err != nil || e.State != store.EffectPending {
		t.Fatalf("stored before the commit: %+v, %v; want still pending", e, err)
	}
	if v, err := l.Since(ctx, "a", time.Time{}); err != nil || len(v) != 1 || v[0].State != store.EffectCompleted || v[0].Status != 201 {
		t.Fatalf("listing while the outcome commits = %+v, %v; want it completed", v, err)
	}
	rep := make(chan egress.Ticket, 1)
	go func() {
		rt, _ := l.Begin(ctx, post("a", "k1", "b"))
		rep <- rt
	}()
	select {
	case rt := <-rep:
		t.Fatalf("a repeat was answered before the outcome was stored: %+v", rt)
	case <-time.After(100 * time.Millisecond):
	}
	g.open()
	if rt := <-rep; rt.Replay == nil || rt.Replay.Status != 201 || string(rt.Replay.Body) != "ok" {
		t.Fatalf("repeat after the outcome was stored = %+v; want the replay", rt)
	}
	if e, err := g.Store.GetEffect(ctx, tk.Effect); err != nil || e.State != store.EffectCompleted {
		t.Fatalf("stored outcome %+v, %v", e, err)
	}
}

// Intents that arrive while a commit is under way share the next one, and
// none returns before its own commit is done.
func TestIntentsShareACommit(t *testing.T) {
	l, g := newGated(t, "a")
	ctx := t.Context()
	g.hold()
	const n = 8
	type res struct {
		t   egress.Ticket
		err error
	}
	out := make(chan res, n+1)
	begin := func(key string) {
		tk, err := l.Begin(ctx, post("a", key, "b"))
		out <- res{tk, err}
	}
	go begin("first")
	for deadline := time.Now().Add(10 * time.Second); len(g.commits()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no commit started")
		}
	}
	for i := range n {
		go begin(string(rune('a' + i)))
	}
	queued(t, l, n)
	select {
	case r := <-out:
		t.Fatalf("an intent returned before its commit: %+v, %v", r.t, r.err)
	default:
	}
	g.open()
	for range n + 1 {
		if r := <-out; r.err != nil || r.t.Effect == "" {
			t.Fatalf("Begin = %+v, %v; want sent", r.t, r.err)
		}
	}
	if c := g.commits(); len(c) != 2 || c[0] != 1 || c[1] != n {
		t.Fatalf("commits %v; want [1 %d]: the intents queued during the first commit share the second", c, n)
	}
	if got, err := g.Store.ListEffects(ctx, store.EffectFilter{SandboxID: "a"}); err != nil || len(got) != n+1 {
		t.Fatalf("stored %d intents, %v; want %d", len(got), err, n+1)
	}
}

// A repeat decided while the first intent's commit is under way waits for
// it (it is in flight, not yet in the store); when that commit fails the
// first is not sent, and the repeat decides again and is sent itself.
func TestRepeatOfAnIntentBeingCommitted(t *testing.T) {
	l, g := newGated(t, "a")
	ctx := t.Context()
	gate := g.hold()
	first := make(chan error, 1)
	go func() {
		_, err := l.Begin(ctx, post("a", "k", "b"))
		first <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); len(g.commits()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no commit started")
		}
	}
	second := make(chan egress.Ticket, 1)
	go func() {
		tk, _ := l.Begin(ctx, post("a", "k", "b"))
		second <- tk
	}()
	select {
	case tk := <-second:
		t.Fatalf("a repeat of an intent being committed was answered: %+v", tk)
	case <-time.After(100 * time.Millisecond):
	}
	gone := errs.E(errs.Unavailable, "disk gone")
	g.mu.Lock()
	g.fail, g.gate = gone, nil
	g.mu.Unlock()
	close(gate)
	if err := <-first; !errors.Is(err, gone) {
		t.Fatalf("first Begin = %v; want the commit's error (not sent)", err)
	}
	if tk := <-second; tk.Effect == "" || tk.Replay != nil {
		t.Fatalf("repeat after the first failed to record = %+v; want it sent", tk)
	}
	if got, _ := g.Store.ListEffects(ctx, store.EffectFilter{SandboxID: "a"}); len(got) != 1 {
		t.Fatalf("stored %d effects, want 1 (the failed intent is not in the store)", len(got))
	}
	l.mu.Lock()
	n := l.counts["a"].n
	l.mu.Unlock()
	if n != 1 {
		t.Fatalf("usage %d, want 1: a failed intent does not count", n)
	}
}

// An outcome lingers for the next intent's commit (one commit for both);
// without one it is committed on its own once linger is up.
func TestOutcomeRidesWithTheNextIntent(t *testing.T) {
	l, g := newGated(t, "a")
	ctx := t.Context()
	l.w.linger = time.Hour
	a := sent(t, l, post("a", "ka", "b"))
	l.Finish(ctx, a.Effect, egress.Outcome{Status: 200, Complete: true})
	b := sent(t, l, post("a", "kb", "b"))
	if c := g.commits(); len(c) != 2 || c[1] != 2 {
		t.Fatalf("commits %v; want [1 2]: a's outcome with b's intent", c)
	}
	if e, err := g.Store.GetEffect(ctx, a.Effect); err != nil || e.State != store.EffectCompleted {
		t.Fatalf("a = %+v, %v; want completed with b's intent", e, err)
	}
	l.Finish(ctx, b.Effect, egress.Outcome{Status: 200, Complete: true})
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := g.Store.GetEffect(ctx, b.Effect); err != nil || e.State != store.EffectCompleted {
		t.Fatalf("b after Flush = %+v, %v; want completed", e, err)
	}
	l.w.mu.Lock()
	l.w.linger = time.Millisecond
	l.w.mu.Unlock()
	c := sent(t, l, post("a", "kc", "b"))
	l.Finish(ctx, c.Effect, egress.Outcome{Status: 200, Complete: true})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e, err := g.Store.GetEffect(ctx, c.Effect); err == nil && e.State == store.EffectCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a lone outcome was never committed")
		}
	}
}

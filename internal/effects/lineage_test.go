package effects

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/store"
)

// slowReads holds the decision's read of one lineage until released.
type slowReads struct {
	store.Store
	lineage string
	entered chan struct{}
	release chan struct{}
}

func (s *slowReads) FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]store.Effect, error) {
	if lineage == s.lineage {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.FindEffects(ctx, lineage, key, identity, limit)
}

// Lineages decide in parallel: while one lineage's decision reads the
// store, another lineage's request is decided and recorded; a second
// request of the held lineage waits for the first decision.
func TestLineagesDecideInParallel(t *testing.T) {
	_, st := newLedger(t, Config{}, "a", "b")
	sr := &slowReads{Store: st, lineage: "a", entered: make(chan struct{}, 4), release: make(chan struct{})}
	l := New(storeCore{sr}, Config{})
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	ctx := t.Context()
	type res struct {
		t   egress.Ticket
		err error
	}
	first := make(chan res, 1)
	go func() { tk, err := l.Begin(ctx, post("a", "k1", "x")); first <- res{tk, err} }()
	<-sr.entered // a's decision is reading
	done := make(chan res, 1)
	go func() { tk, err := l.Begin(ctx, post("b", "k1", "x")); done <- res{tk, err} }()
	select {
	case r := <-done:
		if r.err != nil || r.t.Effect == "" {
			t.Fatalf("b's Begin = %+v, %v; want it sent", r.t, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another lineage's decision waited for lineage a's")
	}
	second := make(chan res, 1)
	go func() { tk, err := l.Begin(ctx, post("a", "k1", "x")); second <- res{tk, err} }()
	select {
	case <-sr.entered:
		t.Fatal("a second decision of lineage a read the store while the first was deciding")
	case r := <-second:
		t.Fatalf("a second decision of lineage a was made while the first was deciding: %+v", r.t)
	case <-time.After(100 * time.Millisecond):
	}
	close(sr.release)
	r := <-first
	if r.err != nil || r.t.Effect == "" {
		t.Fatalf("a's Begin = %+v, %v; want it sent", r.t, r.err)
	}
	// The repeat with the same key, decided after the first: that one is
	// in flight, so the repeat waits for its outcome and is answered by it.
	l.Finish(ctx, r.t.Effect, egress.Outcome{Status: 201, Body: []byte("ok"), Complete: true, Size: 2})
	r2 := <-second
	if r2.err != nil || r2.t.Replay == nil || r2.t.Effect != r.t.Effect {
		t.Fatalf("the repeat = %+v, %v; want the first's answer replayed", r2.t, r2.err)
	}
	l.mu.Lock()
	n := len(l.lineages)
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d lineage locks left after every decision ended", n)
	}
}

// stepAfterRead names step "task/1", but only once the decision's store
// read has begun (or "sequential" after 5 s): with the agent's key the
// step is looked up alongside the read, not before it.
type stepAfterRead struct{ read chan struct{} }

func (s stepAfterRead) CurrentStep(context.Context, string) string {
	select {
	case <-s.read:
		return "task/1"
	case <-time.After(5 * time.Second):
		return "sequential"
	}
}

type signalReads struct {
	store.Store
	read chan struct{}
	once sync.Once
}

func (s *signalReads) FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]store.Effect, error) {
	s.once.Do(func() { close(s.read) })
	return s.Store.FindEffects(ctx, lineage, key, identity, limit)
}

func TestStepLookedUpAlongsideTheRead(t *testing.T) {
	_, st := newLedger(t, Config{}, "a")
	read := make(chan struct{})
	l := New(storeCore{&signalReads{Store: st, read: read}}, Config{Steps: stepAfterRead{read}})
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	tk := sent(t, l, post("a", "k1", "x"))
	if err := l.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	e, err := st.GetEffect(t.Context(), tk.Effect)
	if err != nil || e.Step != "task/1" {
		t.Fatalf("effect = %+v, %v; want step task/1 (looked up while the store was read)", e, err)
	}
	if want := Identity("a", "task/1", "POST", "api.test", "/send", "x"); e.Identity != want {
		t.Fatalf("identity %s, want the one of step task/1 (%s)", e.Identity, want)
	}
}

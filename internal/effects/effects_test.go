package effects

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// storeCore is the ledger's Core over a real SQLite store.
type storeCore struct{ st store.Store }

func (c storeCore) Store() store.Store { return c.st }
func (c storeCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || (owner != "" && sb.Owner != owner) {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

type auditLog struct {
	mu      sync.Mutex
	actions []string
}

func (a *auditLog) Audit(_ context.Context, _, action, _ string, _ map[string]string) {
	a.mu.Lock()
	a.actions = append(a.actions, action)
	a.mu.Unlock()
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

func newLedger(t testing.TB, cfg Config, ids ...string) (*Service, store.Store) {
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
	if cfg.Now == nil {
		c := &clock{now: t0}
		cfg.Now = c.Now
	}
	l := New(storeCore{st}, cfg)
	t.Cleanup(func() { _ = l.Flush(context.Background()) }) // before the store closes
	return l, st
}

func post(sb, key, body string) egress.Intent {
	return egress.Intent{SandboxID: sb, Method: "POST", Host: "api.test", Port: 443, Path: "/send", BodySHA256: body, Key: key}
}

func sent(t *testing.T, l *Service, in egress.Intent) egress.Ticket {
	t.Helper()
	tk, err := l.Begin(t.Context(), in)
	if err != nil || tk.Effect == "" || tk.Replay != nil {
		t.Fatalf("Begin(%+v) = %+v, %v; want it sent", in, tk, err)
	}
	return tk
}

func TestLedgerForkRewindAndBounds(t *testing.T) {
	audit := &auditLog{}
	l, st := newLedger(t, Config{Audit: audit}, "parent", "child", "other")
	ctx := t.Context()
	tk := sent(t, l, post("parent", "k1", "b1"))
	// The intent is durable before the request may go out.
	if e, err := st.GetEffect(ctx, tk.Effect); err != nil || e.State != store.EffectPending || e.Key != "k1" || e.KeySource != "agent" {
		t.Fatalf("intent row = %+v, %v; want a pending effect with the agent's key", e, err)
	}
	l.Finish(ctx, tk.Effect, egress.Outcome{Status: 201, Header: http.Header{"X-Id": {"42"}}, Body: []byte("made"), Complete: true, Size: 4})
	forkAt := l.cfg.Now()
	if err := l.OnState(ctx, statehook.Event{Phase: statehook.Forked, Sandbox: &sandbox.Sandbox{ID: "child"}, From: "parent", PointAt: forkAt}); err != nil {
		t.Fatal(err)
	}
	// The child sees the parent's effect, inherited; its retry is replayed.
	views, err := l.List(ctx, "alice", "child", time.Time{})
	if err != nil || len(views) != 1 || !views[0].Inherited || views[0].ID != tk.Effect || !views[0].Replayable {
		t.Fatalf("child's view = %+v, %v; want the parent's effect, inherited", views, err)
	}
	rt, err := l.Begin(ctx, post("child", "k1", "b1"))
	if err != nil || rt.Replay == nil || rt.Replay.Status != 201 || string(rt.Replay.Body) != "made" || rt.Replay.Header.Get("X-Id") != "42" {
		t.Fatalf("child's retry = %+v, %v; want the recorded answer", rt, err)
	}
	// A parent effect after the fork is not the child's.
	later := sent(t, l, post("parent", "k2", "b2"))
	l.Finish(ctx, later.Effect, egress.Outcome{Status: 200, Complete: true})
	if views, _ := l.List(ctx, "alice", "child", time.Time{}); len(views) != 1 {
		t.Fatalf("child sees %d effects, want 1 (the parent's later effect is not inherited)", len(views))
	}
	// Another lineage using the same key is not a repeat: it cannot read the answer.
	if tk := sent(t, l, post("other", "k1", "b1")); tk.Replay != nil {
		t.Fatal("another lineage's key was replayed")
	}
	// repeat: refuse.
	in := post("child", "k1", "b1")
	in.Policy.Repeat = egress.RepeatRefuse
	if rt, err := l.Begin(ctx, in); err != nil || rt.Effect != "" || rt.Replay != nil || rt.Status != http.StatusConflict {
		t.Fatalf("repeat: refuse → %+v, %v; want a 409 refusal", rt, err)
	}
	// Rewind of the parent to before k2: Since lists it; a keyless retry
	// of an undone effect is replayed, of a kept one sent.
	kl := sent(t, l, post("parent", "", "b3"))
	l.Finish(ctx, kl.Effect, egress.Outcome{Status: 202, Body: []byte("q"), Complete: true})
	if err := l.OnState(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: &sandbox.Sandbox{ID: "parent"}, From: "parent", Checkpoint: "c1", PointAt: forkAt, At: l.cfg.Now()}); err != nil {
		t.Fatal(err)
	}
	after, err := l.Since(ctx, "parent", forkAt)
	if err != nil || len(after) != 2 || after[0].ID != later.Effect || after[1].ID != kl.Effect {
		t.Fatalf("Since(fork point) = %+v, %v; want k2's and the keyless effect", after, err)
	}
	if rt, err := l.Begin(ctx, post("parent", "", "b3")); err != nil || rt.Replay == nil || rt.Replay.Status != 202 {
		t.Fatalf("keyless retry of an undone effect = %+v, %v; want a replay", rt, err)
	}
	// A new key is how an agent makes a new effect deliberately; one whose
	// sending broke off is unknown, and its repeat refused.
	nk := sent(t, l, post("parent", "fresh", "b3"))
	l.Finish(ctx, nk.Effect, egress.Outcome{Err: context.DeadlineExceeded})
	if rt, err := l.Begin(ctx, post("parent", "fresh", "b3")); err != nil || rt.Status != http.StatusConflict || rt.Replay != nil {
		t.Fatalf("repeat of an effect with an unknown outcome = %+v, %v; want 409", rt, err)
	}
	// idempotency: derive adds a stable key.
	d := post("parent", "", "b9")
	d.Policy.Idempotency = egress.IdempotencyDerive
	dk := sent(t, l, d)
	if dk.SetKey == "" || dk.SetKey != DeriveKey(Identity("parent", "", "POST", "api.test", "/send", "b9")) {
		t.Fatalf("derived key %q", dk.SetKey)
	}
	// In flight: a concurrent repeat waits for the outcome, then is
	// answered by it (here: an answer too large to replay, so refused).
	got := make(chan egress.Ticket, 1)
	go func() {
		rt, _ := l.Begin(ctx, d)
		got <- rt
	}()
	select {
	case rt := <-got:
		t.Fatalf("repeat while in flight answered before the outcome: %+v", rt)
	case <-time.After(200 * time.Millisecond):
	}
	l.Finish(ctx, dk.Effect, egress.Outcome{Status: 200, Complete: false, Size: 1 << 20})
	if rt := <-got; rt.Status != http.StatusConflict || !strings.Contains(rt.Message, "too large") {
		t.Fatalf("repeat after the in-flight effect finished = %+v; want 409 (not replayable)", rt)
	}
	if rt, err := l.Begin(ctx, d); err != nil || rt.Status != http.StatusConflict {
		t.Fatalf("repeat of an answer too large to replay = %+v, %v; want 409", rt, err)
	}
	audit.mu.Lock()
	n := len(audit.actions)
	audit.mu.Unlock()
	if n == 0 {
		t.Fatal("nothing audited")
	}
}

func TestLedgerBounds(t *testing.T) {
	l, _ := newLedger(t, Config{MaxPerSandbox: 3, ReplayBudget: 200}, "a")
	ctx := t.Context()
	for i := range 3 {
		tk := sent(t, l, post("a", "", string(rune('a'+i))))
		l.Finish(ctx, tk.Effect, egress.Outcome{Status: 200, Body: make([]byte, 100), Complete: true})
	}
	tk, err := l.Begin(ctx, post("a", "", "z"))
	if err != nil || tk.Effect != "" || tk.Status != http.StatusTooManyRequests {
		t.Fatalf("past the cap: %+v, %v; want 429, not sent", tk, err)
	}
	views, err := l.List(ctx, "", "a", time.Time{})
	if err != nil || len(views) != 3 {
		t.Fatalf("views %d, %v", len(views), err)
	}
	if !views[0].Replayable || views[2].Replayable {
		t.Fatalf("replay budget: replayable = %v %v %v; want the first kept, the last over budget", views[0].Replayable, views[1].Replayable, views[2].Replayable)
	}
	if _, err := l.List(ctx, "mallory", "a", time.Time{}); !errs.Is(err, errs.NotFound) {
		t.Fatalf("another owner lists: %v, want NotFound", err)
	}
}

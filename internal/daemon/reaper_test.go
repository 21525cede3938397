package daemon

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// testClock is an injected clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// signalsDaemon is a daemon over a real SQLite store with no runtime: the
// reaper's decisions and events are real; its effects fail (no runtime),
// which is recorded and harmless here.
func signalsDaemon(t *testing.T, st store.Store, clk *testClock) *Daemon {
	t.Helper()
	fast := reaper.Policy{ClientIdle: reaper.Duration(time.Minute), APIIdle: reaper.Duration(time.Minute),
		WriteIdle: reaper.Duration(time.Minute), EgressIdle: reaper.Duration(time.Minute), CPUIdle: reaper.Duration(time.Minute),
		PauseMode: sandbox.PauseFreeze, DiskAfter: reaper.Duration(10 * time.Minute), ArchiveAfter: reaper.Duration(time.Hour)}
	cfg := Config{DataDir: t.TempDir(), AgentPath: "/nonexistent", Now: clk.Now,
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Reaper: reaper.Config{DefaultPolicy: "fast", Policies: map[string]reaper.Policy{"fast": fast}}}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bg, cancel := context.WithCancel(context.Background())
	d := &Daemon{cfg: cfg, log: cfg.Log, store: st, runtimes: map[string]runtime.Runtime{},
		locks: map[string]*sync.Mutex{}, bg: bg, cancel: cancel}
	wireCore(d, make([]byte, agentapi.KeySize))
	t.Cleanup(d.Close)
	return d
}

func reaperActions(t *testing.T, st store.Store, id string) []string {
	t.Helper()
	evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		if ev.Type == "reaper" {
			out = append(out, ev.Data["action"]+":"+ev.Reason)
		}
	}
	return out
}

// TestReaperSignals drives the daemon's signal plumbing with an injected
// clock: an open API stream, a lease and in-flight egress (fed through
// NoteEgress, as the egress proxy will) keep sandboxes awake; an idle one
// is paused. After a restart the persisted signals are re-derived: nothing
// is idle since the epoch, and lost in-flight counts do not keep anything
// busy forever.
func TestReaperSignals(t *testing.T) {
	defer goleak.VerifyNone(t)
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	clk := &testClock{now: t0}
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := signalsDaemon(t, st, clk)
	ctx := t.Context()
	mk := func(id string, extra map[string]string) {
		sb := &sandbox.Sandbox{ID: id, Owner: "alice", Template: "tiny", TemplateID: "sha256:x", Runtime: "runc",
			State: sandbox.Running, CreatedAt: t0, StartedAt: t0, ExpiresAt: t0.Add(24 * time.Hour),
			ExpiryAction: sandbox.ExpireStop, Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 64, DiskMiB: 64, Pids: 64},
			Extra: extra}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	mk("idle", nil)
	mk("leased", map[string]string{"lease_until": t0.Add(time.Hour).Format(time.RFC3339Nano)})
	mk("stream", nil)
	mk("egress", nil)
	mk("never", map[string]string{ExtraIdlePolicy: reaper.PolicyNever})

	state := map[string]*tracked{}
	round := func(at time.Duration) {
		clk.set(t0.Add(at))
		d.reapRound(ctx, state)
	}
	round(0)
	closeStream := d.OpenStream("stream")
	d.NoteEgress("egress", 2)
	round(30 * time.Second)
	round(2 * time.Minute)
	want := map[string][]string{"idle": {"pause:idle"}}
	for _, id := range []string{"idle", "leased", "stream", "egress", "never"} {
		if got := reaperActions(t, st, id); len(got) != len(want[id]) || (len(got) > 0 && got[0] != want[id][0]) {
			t.Errorf("%s: reaper actions %v, want %v", id, got, want[id])
		}
	}

	// The client leaves and the request completes: each is idle one window later.
	closeStream()
	d.NoteEgress("egress", 0)
	round(2*time.Minute + 30*time.Second)
	if got := reaperActions(t, st, "stream"); len(got) != 0 {
		t.Errorf("stream reaped 30s after its client left: %v", got)
	}
	round(3*time.Minute + time.Second)
	for _, id := range []string{"stream", "egress"} {
		if got := reaperActions(t, st, id); len(got) != 1 || got[0] != "pause:idle" {
			t.Errorf("%s: reaper actions %v after a quiet window, want [pause:idle]", id, got)
		}
	}

	// Persisted: the usage rows carry the signals and a last-active time.
	us, err := st.ListUsage(ctx, store.UsageFilter{SandboxID: "egress"})
	if err != nil || len(us) != 1 || us[0].LastActiveAt.IsZero() || us[0].Signals == "" {
		t.Fatalf("persisted signals of egress: %+v, %v", us, err)
	}

	// Restart (a new daemon on the same store) while "leased2" had in-flight
	// egress: the count is gone with the old process, so it is not busy
	// forever, but its idleness is floored at the restart, never the epoch.
	mk("leased2", nil)
	d.NoteEgress("leased2", 1)
	round(4 * time.Minute)
	d.Close()
	clk.set(t0.Add(10 * time.Minute))
	d2 := signalsDaemon(t, st, clk)
	state2 := map[string]*tracked{}
	if err := d2.loadTracked(ctx, state2); err != nil {
		t.Fatal(err)
	}
	if tr := state2["leased2"]; tr == nil || tr.sig.LastEgress.IsZero() || !tr.since.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("re-derived signals of leased2: %+v", tr)
	}
	clk.set(t0.Add(10*time.Minute + 30*time.Second))
	d2.reapRound(ctx, state2)
	if got := reaperActions(t, st, "leased2"); len(got) != 0 {
		t.Errorf("reaped 30s after a restart: %v", got)
	}
	clk.set(t0.Add(11*time.Minute + time.Second))
	d2.reapRound(ctx, state2)
	if got := reaperActions(t, st, "leased2"); len(got) != 1 || got[0] != "pause:idle" {
		t.Errorf("after a restart and a quiet window: %v, want [pause:idle]", got)
	}
	// Leases persist in the sandbox itself: still honoured after the restart.
	if got := reaperActions(t, st, "leased"); len(got) != 0 {
		t.Errorf("leased sandbox reaped: %v", got)
	}
	// Every reaper event names the signals that led to it.
	evs, _ := st.ListEvents(ctx, store.EventFilter{SandboxID: "idle"})
	for _, ev := range evs {
		if ev.Type == "reaper" && (ev.Data["clients"] != "0" || ev.Data["egress_inflight"] != "0" || ev.Data["policy"] != "fast") {
			t.Errorf("reaper event lacks its signals: %+v", ev.Data)
		}
	}
}

// TestAdmitQuotaRace: concurrent admits against a limit of 3 let exactly 3
// through, and the refused ones write nothing.
func TestAdmitQuotaRace(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := &testClock{now: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := signalsDaemon(t, st, clk)
	if _, err := d.SetQuota(t.Context(), "bob", quotaLimits3()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errsCh := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: "bob", Template: "tiny", Runtime: "runc", State: sandbox.Creating,
				Resources: sandbox.Resources{CPUMillis: 500, MemoryMiB: 64, DiskMiB: 64, Pids: 64}}
			errsCh <- d.admit(t.Context(), sb)
		}()
	}
	wg.Wait()
	close(errsCh)
	ok := 0
	for err := range errsCh {
		if err == nil {
			ok++
		}
	}
	list, _, _ := st.ListSandboxes(t.Context(), store.SandboxFilter{Owner: "bob"})
	if ok != 3 || len(list) != 3 {
		t.Errorf("admitted %d, stored %d; want 3 and 3", ok, len(list))
	}
}

func quotaLimits3() quota.Limits { return quota.Limits{Sandboxes: 3} }

// TestForeignClientKeepsNothingAwake: a request another tenant makes on a
// sandbox's client routes (refused by the handler) is no reaper activity;
// the owner's and the admin's are.
func TestForeignClientKeepsNothingAwake(t *testing.T) {
	defer goleak.VerifyNone(t)
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	clk := &testClock{now: t0}
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := signalsDaemon(t, st, clk)
	ctx := t.Context()
	sb := &sandbox.Sandbox{ID: "mine", Owner: "alice", Template: "tiny", TemplateID: "sha256:x", Runtime: "runc",
		State: sandbox.Running, CreatedAt: t0, StartedAt: t0, ExpiresAt: t0.Add(24 * time.Hour),
		ExpiryAction: sandbox.ExpireStop, Resources: sandbox.Resources{CPUMillis: 1000, MemoryMiB: 64, DiskMiB: 64, Pids: 64}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	clk.set(t0.Add(time.Minute))
	done := d.OpenClientStream(ctx, "bob", "mine")
	if l := d.acct().liveOf("mine"); l.streams != 0 || !l.lastClient.IsZero() || !l.lastAPI.IsZero() {
		t.Fatalf("bob's request counted as activity on alice's sandbox: %+v", l)
	}
	done()
	if l := d.acct().liveOf("mine"); l.streams != 0 || !l.lastClient.IsZero() {
		t.Fatalf("bob's finished request counted as activity: %+v", l)
	}
	for _, who := range []string{"alice", ""} { // the owner, the admin
		done := d.OpenClientStream(ctx, who, "mine")
		if l := d.acct().liveOf("mine"); l.streams != 1 || !l.lastClient.Equal(t0.Add(time.Minute)) {
			t.Fatalf("%q's request is not activity: %+v", who, l)
		}
		done()
	}
}

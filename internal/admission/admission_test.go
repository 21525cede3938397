package admission

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCore is the lifecycle core as admission and the reaper loop see it:
// a real SQLite store, an injected clock, no runtime (so no cgroup
// samples), and reaper actions that are recorded and applied to the store.
type testCore struct {
	st  store.Store
	dir string

	mu      sync.Mutex
	now     time.Time
	actions []string // "action id mode reason"
}

func (c *testCore) Store() store.Store { return c.st }
func (c *testCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || (owner != "" && sb.Owner != owner) || sb.State == sandbox.Deleted {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}
func (c *testCore) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	return nil, errs.E(errs.FailedPrecondition, "no runtime in this test")
}
func (c *testCore) SandboxDir(id string) string { return filepath.Join(c.dir, "sandboxes", id) }
func (c *testCore) Log() *slog.Logger           { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func (c *testCore) Now() time.Time              { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testCore) set(t time.Time)             { c.mu.Lock(); c.now = t; c.mu.Unlock() }

func (c *testCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	_, _ = c.st.AppendEvent(ctx, sandbox.Event{SandboxID: sb.ID, Owner: sb.Owner, Time: c.Now(), Actor: actor, Type: typ,
		Reason: reason, Message: msg, Data: data})
}
func (c *testCore) Activity(context.Context, string) (agentapi.Activity, error) {
	return agentapi.Activity{}, errs.E(errs.Unavailable, "no agent in this test")
}
func (c *testCore) Exempt(sb *sandbox.Sandbox) bool { return sb.Owner == "pool" }
func (c *testCore) LeaseUntil(sb *sandbox.Sandbox) time.Time {
	return sb.LeaseUntil
}
func (c *testCore) record(ctx context.Context, action, id string, mode sandbox.PauseMode, reason string, to sandbox.State) error {
	c.mu.Lock()
	c.actions = append(c.actions, strings.TrimSpace(action+" "+id+" "+string(mode)+" "+reason))
	c.mu.Unlock()
	_, err := c.st.Transition(ctx, id, to, sandbox.Event{SandboxID: id, Time: c.Now(), Actor: "reaper", Type: "transition", Reason: reason},
		func(sb *sandbox.Sandbox) error {
			if mode != "" {
				sb.PauseActual = mode
			}
			return nil
		})
	return err
}
func (c *testCore) Pause(ctx context.Context, sb *sandbox.Sandbox, mode sandbox.PauseMode, reason string) error {
	if mode == "" {
		mode = sandbox.PauseDisk
	}
	return c.record(ctx, "pause", sb.ID, mode, reason, sandbox.Paused)
}
func (c *testCore) DemoteToDisk(ctx context.Context, id, reason string) error {
	return c.record(ctx, "pause-disk", id, sandbox.PauseDisk, reason, sandbox.Paused)
}
func (c *testCore) Stop(ctx context.Context, id, reason string) error {
	return c.record(ctx, "stop", id, "", reason, sandbox.Stopped)
}
func (c *testCore) Delete(ctx context.Context, id, reason string) error {
	return c.record(ctx, "delete", id, "", reason, sandbox.Deleted)
}
func (c *testCore) took() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.actions
	c.actions = nil
	return out
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func fastConfig() Config {
	fast := reaper.Policy{ClientIdle: reaper.Duration(time.Minute), APIIdle: reaper.Duration(time.Minute),
		WriteIdle: reaper.Duration(time.Minute), EgressIdle: reaper.Duration(time.Minute), CPUIdle: reaper.Duration(time.Minute),
		PauseMode: sandbox.PauseFreeze, DiskAfter: reaper.Duration(10 * time.Minute), ArchiveAfter: reaper.Duration(time.Hour)}
	cfg := Config{Reaper: reaper.Config{DefaultPolicy: "fast", Policies: map[string]reaper.Policy{"fast": fast}},
		Prices: metering.DefaultPrices(), CgroupRoot: "/nonexistent"}
	cfg.Reaper.SetDefaults()
	return cfg
}

func newTest(t *testing.T, cfg Config) (*Service, *testCore) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := &testCore{st: st, dir: t.TempDir(), now: t0}
	return New(c, cfg), c
}

func mk(t *testing.T, c *testCore, id, owner string, state sandbox.State, r sandbox.Resources, attrs sandbox.Attrs) *sandbox.Sandbox {
	t.Helper()
	sb := &sandbox.Sandbox{ID: id, Owner: owner, Template: "tiny", TemplateID: "sha256:x", Runtime: "runc",
		State: state, CreatedAt: t0, StartedAt: t0, ExpiresAt: t0.Add(24 * time.Hour),
		ExpiryAction: sandbox.ExpireStop, Resources: r, Attrs: attrs}
	if err := c.st.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

var small = sandbox.Resources{CPUMillis: 1000, MemoryMiB: 64, DiskMiB: 64, Pids: 64}

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

// TestReaperRound drives the reaper loop one round at a time with an
// injected clock: an open API stream, a lease and in-flight egress (fed
// through NoteEgress, as the egress proxy does) keep sandboxes awake; an
// idle one is paused in its policy's mode; warm pool members and "never"
// are left alone. After a restart the persisted signals are re-derived:
// nothing is idle since the epoch, and lost in-flight counts do not keep
// anything busy forever.
func TestReaperRound(t *testing.T) {
	a, c := newTest(t, fastConfig())
	ctx := t.Context()
	mk(t, c, "idle", "alice", sandbox.Running, small, sandbox.Attrs{})
	mk(t, c, "leased", "alice", sandbox.Running, small, sandbox.Attrs{LeaseUntil: t0.Add(time.Hour)})
	mk(t, c, "stream", "alice", sandbox.Running, small, sandbox.Attrs{})
	mk(t, c, "egress", "alice", sandbox.Running, small, sandbox.Attrs{})
	mk(t, c, "never", "alice", sandbox.Running, small, sandbox.Attrs{IdlePolicy: reaper.PolicyNever})
	mk(t, c, "member", "pool", sandbox.Running, small, sandbox.Attrs{})

	r := a.NewReaper(c)
	round := func(at time.Duration) {
		c.set(t0.Add(at))
		r.Round(ctx)
	}
	round(0)
	closeStream := a.OpenStream("stream")
	a.NoteEgress("egress", 2)
	round(30 * time.Second)
	round(2 * time.Minute)
	if got, want := c.took(), []string{"pause idle freeze idle"}; strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("actions after 2m: %q, want %q", got, want)
	}
	for _, id := range []string{"leased", "stream", "egress", "never", "member"} {
		if got := reaperActions(t, c.st, id); len(got) != 0 {
			t.Errorf("%s: reaper actions %v, want none", id, got)
		}
	}

	// The client leaves and the request completes: each is idle one window later.
	closeStream()
	a.NoteEgress("egress", 0)
	round(2*time.Minute + 30*time.Second)
	if got := c.took(); len(got) != 0 {
		t.Errorf("reaped 30s after the client left: %v", got)
	}
	round(3*time.Minute + time.Second)
	if got, want := strings.Join(c.took(), ";"), "pause stream freeze idle;pause egress freeze idle"; got != want &&
		got != "pause egress freeze idle;pause stream freeze idle" {
		t.Errorf("actions after a quiet window: %q, want %q", got, want)
	}

	// Persisted: the usage rows carry the signals and a last-active time.
	us, err := c.st.ListUsage(ctx, store.UsageFilter{SandboxID: "egress"})
	if err != nil || len(us) != 1 || us[0].LastActiveAt.IsZero() || us[0].Signals == "" {
		t.Fatalf("persisted signals of egress: %+v, %v", us, err)
	}

	// Restart (a new service on the same store) while "leased2" had
	// in-flight egress: the count is gone with the old process, so it is not
	// busy forever, but its idleness is floored at the restart, never the epoch.
	mk(t, c, "leased2", "alice", sandbox.Running, small, sandbox.Attrs{})
	a.NoteEgress("leased2", 1)
	round(4 * time.Minute)
	c.set(t0.Add(10 * time.Minute))
	a2 := New(c, fastConfig())
	r2 := a2.NewReaper(c)
	if err := r2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if tr := r2.state["leased2"]; tr == nil || tr.sig.LastEgress.IsZero() || !tr.since.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("re-derived signals of leased2: %+v", tr)
	}
	c.took()
	c.set(t0.Add(10*time.Minute + 30*time.Second))
	r2.Round(ctx)
	if got := reaperActions(t, c.st, "leased2"); len(got) != 0 {
		t.Errorf("reaped 30s after a restart: %v", got)
	}
	c.set(t0.Add(11*time.Minute + time.Second))
	r2.Round(ctx)
	if got := reaperActions(t, c.st, "leased2"); len(got) != 1 || got[0] != "pause:idle" {
		t.Errorf("after a restart and a quiet window: %v, want [pause:idle]", got)
	}
	// Leases persist in the sandbox itself: still honoured after the restart.
	if got := reaperActions(t, c.st, "leased"); len(got) != 0 {
		t.Errorf("leased sandbox reaped: %v", got)
	}
	// Every reaper event names the signals that led to it.
	evs, _ := c.st.ListEvents(ctx, store.EventFilter{SandboxID: "idle"})
	for _, ev := range evs {
		if ev.Type == "reaper" && (ev.Data["clients"] != "0" || ev.Data["egress_inflight"] != "0" || ev.Data["policy"] != "fast") {
			t.Errorf("reaper event lacks its signals: %+v", ev.Data)
		}
	}
	// Actions are counted for /metrics.
	var b strings.Builder
	if err := a.WriteMetrics(ctx, &b, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `berth_reaper_actions_total{action="pause",reason="idle"} 3`) {
		t.Errorf("metrics lack the reaper's three pauses:\n%s", b.String())
	}
	if strings.Contains(b.String(), "berth_pool_") {
		t.Error("pool families written without pool figures")
	}
}

// TestUsageAccumulates: metering adds wall-clock time per state between
// samples, at the injected clock, and a deleted sandbox's row is closed.
func TestUsageAccumulates(t *testing.T) {
	a, c := newTest(t, fastConfig())
	ctx := t.Context()
	never := sandbox.Attrs{IdlePolicy: reaper.PolicyNever}
	mk(t, c, "run", "alice", sandbox.Running, small, never)
	mk(t, c, "stop", "alice", sandbox.Stopped, small, never)
	mk(t, c, "other", "bob", sandbox.Running, small, never)
	r := a.NewReaper(c)
	for _, at := range []time.Duration{0, 30 * time.Second, 90 * time.Second, 3 * time.Minute} {
		c.set(t0.Add(at))
		r.Round(ctx)
	}
	rep, err := a.Usage(ctx, "alice", time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]UsageLine{}
	for _, l := range rep.Sandboxes {
		got[l.SandboxID] = l
	}
	if l := got["run"]; l.RunningSeconds != 180 || l.StoppedSeconds != 0 {
		t.Errorf("run: running %v stopped %v, want 180 and 0", l.RunningSeconds, l.StoppedSeconds)
	}
	if l := got["stop"]; l.StoppedSeconds != 180 || l.RunningSeconds != 0 {
		t.Errorf("stop: running %v stopped %v, want 0 and 180", l.RunningSeconds, l.StoppedSeconds)
	}
	if _, ok := got["other"]; ok || len(rep.Owners) != 1 || rep.Owners[0].Owner != "alice" || rep.Owners[0].Sandboxes != 2 {
		t.Errorf("alice's report shows %+v / owners %+v", got, rep.Owners)
	}
	if rep.Owners[0].RunningSeconds != 180 || rep.Owners[0].StoppedSeconds != 180 {
		t.Errorf("owner line %+v", rep.Owners[0])
	}
	if _, err := a.Usage(ctx, "Bad Owner", time.Time{}, ""); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("Usage(bad owner) = %v, want InvalidArgument", err)
	}
	// Deleted between rounds: the row is closed as deleted.
	if _, err := c.st.Transition(ctx, "run", sandbox.Deleted, sandbox.Event{SandboxID: "run", Time: c.Now(), Type: "transition"}, nil); err != nil {
		t.Fatal(err)
	}
	c.set(t0.Add(4 * time.Minute))
	r.Round(ctx)
	us, err := c.st.ListUsage(ctx, store.UsageFilter{SandboxID: "run"})
	if err != nil || len(us) != 1 || us[0].State != sandbox.Deleted {
		t.Errorf("usage of the deleted sandbox: %+v, %v", us, err)
	}
	if _, ok := r.state["run"]; ok {
		t.Error("the loop still tracks a deleted sandbox")
	}
}

// TestAdmitQuotaRace: concurrent admits against a limit of 3 let exactly 3
// through, and the refused ones write nothing.
func TestAdmitQuotaRace(t *testing.T) {
	a, c := newTest(t, fastConfig())
	if _, err := a.SetQuota(t.Context(), "bob", quota.Limits{Sandboxes: 3}); err != nil {
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
			errsCh <- a.Admit(t.Context(), sb)
		}()
	}
	wg.Wait()
	close(errsCh)
	ok := 0
	for err := range errsCh {
		if err == nil {
			ok++
		} else if !errs.Is(err, errs.ResourceExhausted) {
			t.Errorf("refusal of kind %v, want ResourceExhausted", err)
		}
	}
	list, _, _ := c.st.ListSandboxes(t.Context(), store.SandboxFilter{Owner: "bob"})
	if ok != 3 || len(list) != 3 {
		t.Errorf("admitted %d, stored %d; want 3 and 3", ok, len(list))
	}
	var b strings.Builder
	if err := a.WriteMetrics(t.Context(), &b, []PoolMetric{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`berth_quota_rejections_total{limit="sandboxes"} 17`, "# TYPE berth_pool_ready gauge", `berth_sandboxes{state="creating",owner="bob"} 3`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

// TestAdmissionDecisions: limits come from the store before the config;
// starts and snapshot captures in progress count until released (once);
// a stopped sandbox's disk is already counted when it starts again.
func TestAdmissionDecisions(t *testing.T) {
	cfg := fastConfig()
	cfg.Quotas = quota.Config{Default: quota.Limits{Sandboxes: 2, CPU: 2, Snapshots: 1}, Owners: map[string]quota.Limits{"carol": {DiskMiB: 100}}}
	a, c := newTest(t, cfg)
	ctx := t.Context()
	check := func(name string, err error, kind errs.Kind) {
		t.Helper()
		if kind == 0 && err != nil || kind != 0 && !errs.Is(err, kind) {
			t.Errorf("%s: %v, want kind %v", name, err, kind)
		}
	}

	qi, err := a.Quota(ctx, "alice")
	if err != nil || qi.Source != "config" || qi.Limits.Sandboxes != 2 {
		t.Errorf("Quota(alice) = %+v, %v", qi, err)
	}
	mk(t, c, "a1", "alice", sandbox.Running, small, sandbox.Attrs{})
	mk(t, c, "a2", "alice", sandbox.Stopped, small, sandbox.Attrs{})
	check("third sandbox fits (a stopped one is not running)", a.CheckAdmit(ctx, "alice", small), 0)
	rel, err := a.ReserveStart(ctx, &sandbox.Sandbox{ID: "a2", Owner: "alice", Resources: small})
	check("start of a2", err, 0)
	check("a start in progress counts", a.CheckAdmit(ctx, "alice", small), errs.ResourceExhausted)
	rel()
	rel() // release is idempotent
	check("released", a.CheckAdmit(ctx, "alice", small), 0)
	check("cpu limit", a.CheckAdmit(ctx, "alice", sandbox.Resources{CPUMillis: 1500}), errs.ResourceExhausted)
	release, err := a.AdmitClaim(ctx, "alice", small, "")
	check("claim", err, 0)
	release()
	_, err = a.AdmitClaim(ctx, "alice", small, "no-such-policy")
	check("claim with an unknown idle policy", err, errs.InvalidArgument)

	// Stored limits win over the config; deleting them restores the config's.
	if _, err := a.SetQuota(ctx, "alice", quota.Limits{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	check("stored limit", a.CheckAdmit(ctx, "alice", small), errs.ResourceExhausted)
	if qi, _ := a.Quota(ctx, "alice"); qi.Source != "stored" || qi.Use.Sandboxes != 1 {
		t.Errorf("Quota(alice) after SetQuota = %+v", qi)
	}
	if err := a.DeleteQuota(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	check("config limit again", a.CheckAdmit(ctx, "alice", small), 0)
	_, err = a.SetQuota(ctx, "alice", quota.Limits{Sandboxes: -1})
	check("negative limit", err, errs.InvalidArgument)
	_, err = a.Quota(ctx, "Not An Owner")
	check("bad owner", err, errs.InvalidArgument)

	// Snapshots: a capture in progress counts against the limit of 1.
	relSnap, err := a.ReserveSnapshot(ctx, "alice")
	check("first capture", err, 0)
	_, err = a.ReserveSnapshot(ctx, "alice")
	check("second capture while the first runs", err, errs.ResourceExhausted)
	relSnap()
	relSnap()
	relSnap2, err := a.ReserveSnapshot(ctx, "alice")
	check("after release", err, 0)
	relSnap2()

	// Disk of stopped sandboxes counts; starting one adds no disk.
	mk(t, c, "c1", "carol", sandbox.Stopped, sandbox.Resources{CPUMillis: 500, DiskMiB: 80}, sandbox.Attrs{})
	check("disk over the limit", a.CheckAdmit(ctx, "carol", sandbox.Resources{DiskMiB: 40}), errs.ResourceExhausted)
	rel, err = a.ReserveStart(ctx, &sandbox.Sandbox{ID: "c1", Owner: "carol", Resources: sandbox.Resources{CPUMillis: 500, DiskMiB: 80}})
	check("start of a stopped sandbox whose disk is counted", err, 0)
	rel()

	list, err := a.Quotas(ctx)
	if err != nil || len(list) != 1 || list[0].Owner != "carol" {
		t.Errorf("Quotas = %+v, %v; want carol (configured) only", list, err)
	}
}

// TestForeignClientKeepsNothingAwake: a request another tenant makes on a
// sandbox's client routes (refused by the handler) is no reaper activity;
// the owner's and the admin's are.
func TestForeignClientKeepsNothingAwake(t *testing.T) {
	a, c := newTest(t, fastConfig())
	ctx := t.Context()
	mk(t, c, "mine", "alice", sandbox.Running, small, sandbox.Attrs{})
	c.set(t0.Add(time.Minute))
	done := a.OpenClientStream(ctx, "bob", "mine")
	if l := a.Live("mine"); l.Streams != 0 || !l.LastClient.IsZero() || !l.LastAPI.IsZero() {
		t.Fatalf("bob's request counted as activity on alice's sandbox: %+v", l)
	}
	done()
	if l := a.Live("mine"); l.Streams != 0 || !l.LastClient.IsZero() {
		t.Fatalf("bob's finished request counted as activity: %+v", l)
	}
	for _, who := range []string{"alice", ""} { // the owner, the admin
		done := a.OpenClientStream(ctx, who, "mine")
		if l := a.Live("mine"); l.Streams != 1 || !l.LastClient.Equal(t0.Add(time.Minute)) {
			t.Fatalf("%q's request is not activity: %+v", who, l)
		}
		done()
	}
	if l := a.Live("mine"); l.Streams != 0 {
		t.Errorf("streams after done: %d", l.Streams)
	}
}

package pool

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var defRes = sandbox.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048, Pids: 1024}

// core is a small pool.Core over a real SQLite store: members are rows
// (no runtime), background work is queued and run by the test, and the
// clock only moves when the test moves it.
type core struct {
	t  *testing.T
	st store.Store

	mu        sync.Mutex
	now       time.Time
	bg        []func(context.Context)
	createErr error
	created   []string
	drained   []string
	published []string
	events    []string
	locks     map[string]*sync.Mutex
}

func newCore(t *testing.T) *core {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &core{t: t, st: st, now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), locks: map[string]*sync.Mutex{}}
}

func (c *core) Store() store.Store      { return c.st }
func (c *core) Log() *slog.Logger       { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func (c *core) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *core) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func (c *core) Lock(id string) func() {
	c.mu.Lock()
	m := c.locks[id]
	if m == nil {
		m = &sync.Mutex{}
		c.locks[id] = m
	}
	c.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func (c *core) GoBackground(name string, fn func(ctx context.Context)) {
	c.mu.Lock()
	c.bg = append(c.bg, fn)
	c.mu.Unlock()
}

// runBackground runs queued background work (and what it queues) to the end.
func (c *core) runBackground() {
	for {
		c.mu.Lock()
		if len(c.bg) == 0 {
			c.mu.Unlock()
			return
		}
		fn := c.bg[0]
		c.bg = c.bg[1:]
		c.mu.Unlock()
		fn(c.t.Context())
	}
}

func (c *core) pending() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.bg) }

func (c *core) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	c.mu.Lock()
	c.events = append(c.events, sb.ID+" "+actor+" "+reason)
	c.mu.Unlock()
}

func (c *core) CreatePoolMember(ctx context.Context, spec Spec, m sandbox.PoolState) (*sandbox.Sandbox, error) {
	c.mu.Lock()
	err := c.createErr
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	tpl, err := c.st.GetTemplate(ctx, spec.Template)
	if err != nil {
		return nil, err
	}
	now := c.Now()
	sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: Owner, Template: spec.Template, TemplateID: tpl.Fingerprint,
		Runtime: spec.Runtime, State: sandbox.Running, Labels: map[string]string{}, Resources: spec.Resources,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), ExpiryAction: sandbox.ExpireDelete, Attrs: sandbox.Attrs{Pool: m}}
	if err := c.st.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.created = append(c.created, sb.ID)
	c.mu.Unlock()
	return sb, nil
}

func (c *core) DrainPoolMember(ctx context.Context, id string) error {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.Owner != Owner {
		return errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	c.mu.Lock()
	c.drained = append(c.drained, id)
	c.mu.Unlock()
	return c.st.DeleteSandbox(ctx, id)
}

func (c *core) EnvdTokenHash(id, owner string) string { return "hash:" + id + ":" + owner }

func (c *core) PublishEnv(sb *sandbox.Sandbox) error {
	c.mu.Lock()
	c.published = append(c.published, sb.ID)
	c.mu.Unlock()
	return nil
}

func (c *core) PoolMemberMemory(ctx context.Context, runtime, id string) (uint64, error) {
	return 1 << 20, nil
}

func (c *core) putTemplate(name, fp, state string) *store.Template {
	c.t.Helper()
	t, err := c.st.PutTemplate(c.t.Context(), store.Template{Name: name, Fingerprint: fp, Layers: []string{"l"}, State: state})
	if err != nil {
		c.t.Fatal(err)
	}
	return &t
}

func (c *core) members() []*sandbox.Sandbox {
	c.t.Helper()
	ms, _, err := c.st.ListSandboxes(c.t.Context(), store.SandboxFilter{Owner: Owner, Order: store.OrderAsc})
	if err != nil {
		c.t.Fatal(err)
	}
	return ms
}

func newService(c *core) *Service {
	return New(Config{DefaultRuntime: "runc", Runtimes: []string{"runc", "runsc"}, DefaultResources: defRes,
		MaxResources: sandbox.Resources{CPUMillis: 4000, MemoryMiB: 4096, DiskMiB: 8192, Pids: 4096}, Clock: c.Now}, c)
}

func (s *Service) mustStatus(t *testing.T, name string) Status {
	t.Helper()
	st, err := s.status(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSetValidates(t *testing.T) {
	c := newCore(t)
	s := newService(c)
	for _, tc := range []struct {
		name  string
		spec  Spec
		field string
	}{
		{"bad template name", Spec{Template: "Bad/Name", Size: 1}, "template"},
		{"negative size", Spec{Template: "t", Size: -1}, "size"},
		{"too big", Spec{Template: "t", Size: MaxSize + 1}, "size"},
		{"unknown runtime", Spec{Template: "t", Size: 1, Runtime: "kata"}, "runtime"},
		{"min without auto", Spec{Template: "t", Size: 1, Min: 1}, "min"},
		{"auto min above max", Spec{Template: "t", Size: 1, Auto: true, Min: 5, Max: 2}, "max"},
		{"auto max too big", Spec{Template: "t", Size: 1, Auto: true, Max: MaxSize + 1}, "max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Set(t.Context(), tc.spec)
			var e *errs.Error
			if !errors.As(err, &e) || e.Kind != errs.InvalidArgument || e.Field != tc.field {
				t.Fatalf("Set(%+v) = %v, want InvalidArgument on field %q", tc.spec, err, tc.field)
			}
		})
	}
	if ok, err := s.Has(t.Context(), "t"); err != nil || ok {
		t.Errorf("a refused spec was stored: Has = %v, %v", ok, err)
	}
}

func TestSetFillsDefaultsAndPersists(t *testing.T) {
	c := newCore(t)
	s := newService(c)
	st, err := s.Set(t.Context(), Spec{Template: "t", Size: 2, Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Runtime != "runc" || st.Resources != defRes || st.Max != 8 || st.Target != 2 {
		t.Errorf("status = %+v, want runtime runc, default resources, max 4*size, target 2", st)
	}
	// A second service over the same store (a restart) finds the spec.
	s2 := newService(c)
	list, err := s2.List(t.Context())
	if err != nil || len(list) != 1 || list[0].Template != "t" || list[0].Max != 8 {
		t.Fatalf("List after restart = %+v, %v", list, err)
	}
	if err := s2.Remove(t.Context(), "t"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove(t.Context(), "t"); !errs.Is(err, errs.NotFound) {
		t.Errorf("second Remove = %v, want NotFound", err)
	}
	if ok, _ := s.Has(t.Context(), "t"); ok {
		t.Error("Has after Remove")
	}
}

func TestFillStartsWithBoundedConcurrencyAndAdopts(t *testing.T) {
	c := newCore(t)
	c.putTemplate("t", "fp1", store.TemplateReady)
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 3}); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	if n := c.pending(); n != fillParallel {
		t.Fatalf("%d starts queued, want %d (the concurrency bound)", n, fillParallel)
	}
	if st := s.mustStatus(t, "t"); st.Starting != fillParallel || st.State != StateFilling {
		t.Errorf("status = %+v, want %d starting, filling", st, fillParallel)
	}
	c.runBackground()
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	st := s.mustStatus(t, "t")
	if st.Ready != 3 || st.Starting != 0 || st.State != StateReady || st.IdleMemoryBytes != 3<<20 {
		t.Fatalf("status = %+v, want 3 ready", st)
	}
	for _, m := range c.members() {
		if m.ExpiresAt.Before(m.CreatedAt.AddDate(99, 0, 0)) {
			t.Errorf("member %s expires at %v: members must never expire", m.ID, m.ExpiresAt)
		}
		if m.Pool.Member != "t" || m.Pool.Key != s.key("fp1", "runc", defRes) {
			t.Errorf("member %s pool = %+v", m.ID, m.Pool)
		}
	}
	// A restarted service adopts the members instead of starting new ones.
	s2 := newService(c)
	if _, err := s2.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	s2.Pass(t.Context())
	if n := c.pending(); n != 0 {
		t.Errorf("restart queued %d starts, want 0", n)
	}
	if st := s2.mustStatus(t, "t"); st.Ready != 3 {
		t.Errorf("after restart: %d ready, want 3", st.Ready)
	}
	if len(c.created) != 3 || len(c.drained) != 0 {
		t.Errorf("created %d drained %d, want 3 and 0", len(c.created), len(c.drained))
	}
}

func TestClaim(t *testing.T) {
	c := newCore(t)
	tpl := c.putTemplate("t", "fp1", store.TemplateReady)
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 1}); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	plain := ClaimRequest{Owner: "alice", Actor: "alice", Poolable: true, Labels: map[string]string{"a": "b"},
		Env: map[string]string{"K": "V"}, TTL: time.Hour, ExpiryAction: sandbox.ExpirePause, AutoResume: true}

	// Misses that leave the member alone.
	for name, req := range map[string]ClaimRequest{
		"not poolable":       func() ClaimRequest { r := plain; r.Poolable = false; return r }(),
		"other shape":        func() ClaimRequest { r := plain; r.Resources.MemoryMiB = 1024; return r }(),
		"other runtime":      func() ClaimRequest { r := plain; r.Runtime = "runsc"; return r }(),
		"the pool's own ask": func() ClaimRequest { r := plain; r.Owner = Owner; return r }(),
	} {
		if sb, ok := s.Claim(t.Context(), req, tpl); ok {
			t.Errorf("%s: claimed %s", name, sb.ID)
		}
	}
	if sb, ok := s.Claim(t.Context(), plain, &store.Template{Name: "other", Fingerprint: "fp1"}); ok {
		t.Errorf("claimed %s from a template without a pool", sb.ID)
	}

	sb, ok := s.Claim(t.Context(), plain, tpl)
	if !ok {
		t.Fatal("miss on a ready pool")
	}
	got, err := c.st.GetSandbox(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	now := c.Now()
	if got.Owner != "alice" || got.Env["K"] != "V" || got.Labels["a"] != "b" || !got.AutoResume ||
		got.ExpiryAction != sandbox.ExpirePause || !got.CreatedAt.Equal(now) || !got.ExpiresAt.Equal(now.Add(time.Hour)) ||
		got.AccessTokenHash != "hash:"+sb.ID+":alice" {
		t.Errorf("claimed sandbox not personalised: %+v", got)
	}
	if got.Pool != (sandbox.PoolState{ClaimedFrom: "t"}) {
		t.Errorf("claimed sandbox pool = %+v", got.Pool)
	}
	if len(c.published) != 1 || c.published[0] != sb.ID {
		t.Errorf("env published for %v, want [%s]", c.published, sb.ID)
	}
	c.runBackground() // the claim event is written off the hot path
	if len(c.events) != 1 || c.events[0] != sb.ID+" alice claimed_from_pool" {
		t.Errorf("events = %v", c.events)
	}
	// The pool is empty now: a miss.
	if _, ok := s.Claim(t.Context(), plain, tpl); ok {
		t.Error("claimed from an empty pool")
	}
	st := s.mustStatus(t, "t")
	if st.Hits != 1 || st.Misses != 4 { // 3 misses that did not match, 1 on the empty pool
		t.Errorf("hits %d misses %d, want 1 and 4", st.Hits, st.Misses)
	}
	// The next pass sees the claimed sandbox is no member and refills.
	s.Pass(t.Context())
	if c.pending() != 1 {
		t.Errorf("%d starts queued after a claim, want 1", c.pending())
	}
	c.runBackground()
}

func TestClaimSkipsAMemberGoneMeanwhile(t *testing.T) {
	c := newCore(t)
	tpl := c.putTemplate("t", "fp1", store.TemplateReady)
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 2}); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	ms := c.members()
	// The oldest member stopped behind the pool's back.
	if _, err := c.st.UpdateSandbox(t.Context(), ms[0].ID, func(sb *sandbox.Sandbox) error {
		sb.State = sandbox.Stopped
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sb, ok := s.Claim(t.Context(), ClaimRequest{Owner: "bob", Poolable: true}, tpl)
	if !ok || sb.ID != ms[1].ID {
		t.Fatalf("Claim = %v, %v; want the second member %s", sb, ok, ms[1].ID)
	}
	c.runBackground()
}

func TestAutoPoolGrowsOnMissAndShrinksWhenQuiet(t *testing.T) {
	c := newCore(t)
	tpl := c.putTemplate("t", "fp1", store.TemplateReady)
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 1, Auto: true, Min: 1, Max: 3}); err != nil {
		t.Fatal(err)
	}
	fill := func() {
		for range 4 {
			s.Pass(t.Context())
			c.runBackground()
		}
	}
	fill()
	req := ClaimRequest{Owner: "alice", Poolable: true}
	for range 2 { // a hit, then a miss that grows the target
		s.Claim(t.Context(), req, tpl)
	}
	c.runBackground()
	if st := s.mustStatus(t, "t"); st.Target != 2 {
		t.Fatalf("target after a miss = %d, want 2", st.Target)
	}
	fill()
	if st := s.mustStatus(t, "t"); st.Ready != 2 {
		t.Fatalf("ready = %d, want 2", st.Ready)
	}
	c.advance(shrinkAfter / 2)
	fill()
	if st := s.mustStatus(t, "t"); st.Target != 2 {
		t.Fatalf("target shrank after %v, want 2 until %v", shrinkAfter/2, shrinkAfter)
	}
	c.advance(shrinkAfter)
	s.Pass(t.Context())
	st := s.mustStatus(t, "t")
	if st.Target != 1 || st.Ready != 1 || len(c.members()) != 1 {
		t.Fatalf("after a quiet spell: target %d ready %d members %d, want 1/1/1", st.Target, st.Ready, len(c.members()))
	}
	// Never below min.
	c.advance(10 * shrinkAfter)
	fill()
	if st := s.mustStatus(t, "t"); st.Target != 1 {
		t.Errorf("target %d, want min 1", st.Target)
	}
}

func TestFailedStartsBackOff(t *testing.T) {
	c := newCore(t)
	c.putTemplate("t", "fp1", store.TemplateReady)
	c.createErr = errs.E(errs.FailedPrecondition, "layer gone")
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 1}); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	c.runBackground()
	st := s.mustStatus(t, "t")
	if st.State != StateBackoff || !st.RetryAt.Equal(c.Now().Add(time.Second)) || st.Error != "cannot start a member: layer gone" {
		t.Fatalf("status = %+v, want backoff 1s with the reason", st)
	}
	s.Pass(t.Context())
	if c.pending() != 0 {
		t.Fatal("a member was started during the backoff")
	}
	c.advance(time.Second)
	s.Pass(t.Context())
	c.runBackground()
	if st := s.mustStatus(t, "t"); !st.RetryAt.Equal(c.Now().Add(2 * time.Second)) {
		t.Fatalf("second backoff retry at %v, want now+2s", st.RetryAt)
	}
	c.createErr = nil
	c.advance(2 * time.Second)
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	if st := s.mustStatus(t, "t"); st.State != StateReady || st.Error != "" || !st.RetryAt.IsZero() || st.Ready != 1 {
		t.Errorf("after recovery: %+v, want ready with no error", st)
	}
}

func TestRebuiltTemplateAndRemovedPoolDrain(t *testing.T) {
	c := newCore(t)
	c.putTemplate("t", "fp1", store.TemplateReady)
	c.putTemplate("u", "fpu", store.TemplateReady)
	s := newService(c)
	for _, n := range []string{"t", "u"} {
		if _, err := s.Set(t.Context(), Spec{Template: n, Size: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	old := map[string]string{}
	for _, m := range c.members() {
		old[m.Template] = m.ID
	}
	// t is rebuilt: its member is replaced.
	c.putTemplate("t", "fp2", store.TemplateReady)
	s.Pass(t.Context())
	c.runBackground()
	if !contains(c.drained, old["t"]) {
		t.Fatalf("member %s of the old fingerprint not drained (drained %v)", old["t"], c.drained)
	}
	s.Pass(t.Context())
	if st := s.mustStatus(t, "t"); st.Ready != 1 || st.Fingerprint != "fp2" {
		t.Fatalf("status after rebuild = %+v", st)
	}
	// u's pool is removed: its member goes.
	if err := s.Remove(t.Context(), "u"); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	if !contains(c.drained, old["u"]) {
		t.Fatalf("member %s of a removed pool not drained", old["u"])
	}
	// t's template is being rebuilt: wait, drain, say why.
	c.putTemplate("t", "fp2", store.TemplateBuilding)
	s.Pass(t.Context())
	st := s.mustStatus(t, "t")
	if st.State != StateWaiting || st.Error != "template t is not ready" || st.Ready != 0 || len(c.members()) != 0 {
		t.Fatalf("status while building = %+v, members %d", st, len(c.members()))
	}
	var ids []string
	for _, m := range c.members() {
		ids = append(ids, m.ID)
	}
	sort.Strings(ids)
	if len(ids) != 0 {
		t.Errorf("members left: %v", ids)
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	c := newCore(t)
	s := newService(c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	s.Wake()
	cancel()
	<-done
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// scanHook runs after once the next member scan has read the store.
type scanHook struct {
	store.Store
	after func()
}

func (h *scanHook) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*sandbox.Sandbox, string, error) {
	out, next, err := h.Store.ListSandboxes(ctx, f)
	if a := h.after; a != nil {
		h.after = nil
		a()
	}
	return out, next, err
}

// A claim that lands between a pass's scan and its plan: the pass must
// not hand the claimed sandbox out again (it would be a miss for the next
// create, and the refill would wait for another pass).
func TestClaimDuringAPass(t *testing.T) {
	c := newCore(t)
	tpl := c.putTemplate("t", "fp1", store.TemplateReady)
	s := newService(c)
	if _, err := s.Set(t.Context(), Spec{Template: "t", Size: 1}); err != nil {
		t.Fatal(err)
	}
	s.Pass(t.Context())
	c.runBackground()
	s.Pass(t.Context())
	var claimed *sandbox.Sandbox
	hook := &scanHook{Store: c.st}
	hook.after = func() {
		sb, ok := s.Claim(t.Context(), ClaimRequest{Owner: "alice", Poolable: true, TTL: time.Hour}, tpl)
		if !ok {
			t.Error("miss on a ready pool")
		}
		claimed = sb
	}
	c.mu.Lock()
	c.st = hook
	c.mu.Unlock()
	s.Pass(t.Context()) // scans (the member), then the claim takes it, then plans
	if claimed == nil {
		t.FailNow()
	}
	if st := s.mustStatus(t, "t"); st.Ready != 0 {
		t.Errorf("after a claim during the pass: %d ready, want 0 (the claimed %s is no member)", st.Ready, claimed.ID)
	}
	if sb, ok := s.Claim(t.Context(), ClaimRequest{Owner: "bob", Poolable: true, TTL: time.Hour}, tpl); ok {
		t.Errorf("claimed %s again (alice has %s)", sb.ID, claimed.ID)
	}
	c.runBackground()
}

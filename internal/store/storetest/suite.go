// Package storetest is the conformance suite every store.Store backend
// must pass. It is a package of its own, imported only by tests, so that
// neither testing nor go-cmp is linked into the berth binary.
package storetest

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// TestStore runs the conformance suite: open returns a new, empty store for each subtest and
// arranges (t.Cleanup) for it to be closed:
// storetest.TestStore(t, func(t *testing.T) store.Store { ... }).
func TestStore(t *testing.T, open func(t *testing.T) store.Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"SandboxCRUD", suiteSandboxCRUD},
		{"ErrorKinds", suiteErrorKinds},
		{"ListFilters", suiteListFilters},
		{"Pagination", suitePagination},
		{"TransitionLegal", suiteTransitionLegal},
		{"TransitionIllegal", suiteTransitionIllegal},
		{"UpdateRollback", suiteUpdateRollback},
		{"UpdateConcurrent", suiteUpdateConcurrent},
		{"Events", suiteEvents},
		{"APIKeys", suiteAPIKeys},
		{"Templates", suiteTemplates},
		{"Settings", suiteSettings},
		{"EgressLog", suiteEgressLog},
		{"Secrets", suiteSecrets},
		{"Snapshots", suiteSnapshots},
		{"Usage", suiteUsage},
		{"Quotas", suiteQuotas},
		{"Activity", suiteActivity},
		{"UsageHours", suiteUsageHours},
		{"TemplateBuilds", suiteTemplateBuilds},
		{"Merges", suiteMerges},
		{"Checkpoints", suiteCheckpoints},
		{"Tasks", suiteTasks},
		{"Notes", suiteNotes},
		{"Audit", suiteAudit},
		{"Effects", suiteEffects},
		{"EffectBatch", suiteEffectBatch},
		{"Leases", suiteLeases},
		{"TransitionLeases", suiteTransitionLeases},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

// suiteEpoch is a fixed base time so tests never depend on the clock.
var suiteEpoch = time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC)

// suiteOpts treats nil and empty maps/slices alike: a backend need not
// preserve the difference.
var suiteOpts = cmp.Options{cmpopts.EquateEmpty()}

func suiteSandbox(id, owner string, created time.Time) *sandbox.Sandbox {
	return &sandbox.Sandbox{
		ID: id, Owner: owner, Template: "default", TemplateID: "sha256:aa", Runtime: "runc",
		State: sandbox.Creating, Labels: map[string]string{"app": "x"},
		Resources: sandbox.Resources{CPUMillis: 500, MemoryMiB: 256, DiskMiB: 1024, Pids: 64},
		CreatedAt: created, ExpiresAt: created.Add(time.Hour), ExpiryAction: sandbox.ExpireStop,
	}
}

func mustCreate(t *testing.T, s store.Store, sbs ...*sandbox.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := s.CreateSandbox(t.Context(), sb); err != nil {
			t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
		}
	}
}

func ids(sbs []*sandbox.Sandbox) []string {
	out := []string{}
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func suiteSandboxCRUD(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := &sandbox.Sandbox{
		ID: "sb1", Owner: "alice", Template: "python", TemplateID: "sha256:ff", Runtime: "runsc",
		State: sandbox.Running, Reason: "started", Message: "all good",
		Labels:    map[string]string{"team": "ml", "k8s.io/name": "a-b"},
		Env:       map[string]string{"PATH": "/bin", "EMPTY": ""},
		Resources: sandbox.Resources{CPUMillis: 1500, MemoryMiB: 2048, DiskMiB: 10240, Pids: 512},
		CreatedAt: suiteEpoch, StartedAt: suiteEpoch.Add(time.Second), ExpiresAt: suiteEpoch.Add(time.Hour),
		ExpiryAction: sandbox.ExpirePause, AccessTokenHash: "tok",
		PauseRequested: sandbox.PauseMemory, PauseActual: sandbox.PauseDisk, ResumedFrom: sandbox.PauseDisk,
		RestoreCount: 3, AutoResume: true,
		Attrs: sandbox.Attrs{Layers: []string{"sha256:l1", "sha256:l2"}, Lineage: sandbox.Lineage{Parent: "p", Generation: 2, ForkMode: "disk"},
			Net: sandbox.NetState{Policy: []byte(`{"allow":["pypi.org"]}`), Secrets: []sandbox.SecretGrant{{Name: "gh", Placeholder: "X"}},
				Ports: map[string]sandbox.PortGrant{"8080": {TokenHash: "h", CreatedAt: suiteEpoch}}},
			LeaseUntil: suiteEpoch.Add(time.Minute), UserNS: sandbox.UserNSNone},
	}
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if in.Version != 1 {
		t.Errorf("CreateSandbox set Version = %d, want 1", in.Version)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if diff := cmp.Diff(in, got, suiteOpts); diff != "" {
		t.Errorf("GetSandbox after create (-want +got):\n%s", diff)
	}
	byTok, err := s.SandboxByTokenHash(ctx, "tok")
	if err != nil || byTok.ID != "sb1" {
		t.Errorf("SandboxByTokenHash(tok) = %v, %v; want sb1", byTok, err)
	}
	for _, tok := range []string{"", "other"} {
		if _, err := s.SandboxByTokenHash(ctx, tok); !errs.Is(err, errs.NotFound) {
			t.Errorf("SandboxByTokenHash(%q) error = %v, want NotFound", tok, err)
		}
	}

	upd, err := s.UpdateSandbox(ctx, "sb1", func(sb *sandbox.Sandbox) error {
		sb.Message = "changed"
		sb.Labels["new"] = "1"
		delete(sb.Env, "EMPTY")
		return nil
	})
	if err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	want := *in
	want.Message, want.Version = "changed", 2
	want.Labels = map[string]string{"team": "ml", "k8s.io/name": "a-b", "new": "1"}
	want.Env = map[string]string{"PATH": "/bin"}
	if diff := cmp.Diff(&want, upd, suiteOpts); diff != "" {
		t.Errorf("UpdateSandbox result (-want +got):\n%s", diff)
	}
	got, err = s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	if diff := cmp.Diff(&want, got, suiteOpts); diff != "" {
		t.Errorf("GetSandbox after update (-want +got):\n%s", diff)
	}

	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if _, err := s.GetSandbox(ctx, "sb1"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetSandbox after delete: err = %v, want kind NotFound", err)
	}
	// The id is free again.
	mustCreate(t, s, suiteSandbox("sb1", "bob", suiteEpoch))
}

func suiteErrorKinds(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("exists", "alice", suiteEpoch))
	if err := s.CreateAPIKey(ctx, store.APIKey{ID: "k1", Owner: "alice", Hash: []byte("h1"), CreatedAt: suiteEpoch}); err != nil {
		t.Fatalf("CreateAPIKey: %v", err)
	}
	noop := func(*sandbox.Sandbox) error { return nil }
	for _, tc := range []struct {
		name string
		call func() error
		want errs.Kind
	}{
		{"create duplicate sandbox", func() error { return s.CreateSandbox(ctx, suiteSandbox("exists", "bob", suiteEpoch)) }, errs.AlreadyExists},
		{"create sandbox bad id", func() error { return s.CreateSandbox(ctx, suiteSandbox("Bad-ID", "bob", suiteEpoch)) }, errs.InvalidArgument},
		{"get missing sandbox", func() error { _, err := s.GetSandbox(ctx, "missing"); return err }, errs.NotFound},
		{"update missing sandbox", func() error { _, err := s.UpdateSandbox(ctx, "missing", noop); return err }, errs.NotFound},
		{"update changes id", func() error {
			_, err := s.UpdateSandbox(ctx, "exists", func(sb *sandbox.Sandbox) error { sb.ID = "other"; return nil })
			return err
		}, errs.InvalidArgument},
		{"transition missing sandbox", func() error {
			_, err := s.Transition(ctx, "missing", sandbox.Running, sandbox.Event{}, nil)
			return err
		}, errs.NotFound},
		{"delete missing sandbox", func() error { return s.DeleteSandbox(ctx, "missing") }, errs.NotFound},
		{"list bad order", func() error { _, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Order: "up"}); return err }, errs.InvalidArgument},
		{"list bad cursor", func() error { _, _, err := s.ListSandboxes(ctx, store.SandboxFilter{After: "!!"}); return err }, errs.InvalidArgument},
		{"list negative limit", func() error { _, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Limit: -1}); return err }, errs.InvalidArgument},
		{"append event without type", func() error { _, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "exists"}); return err }, errs.InvalidArgument},
		{"create duplicate api key id", func() error {
			return s.CreateAPIKey(ctx, store.APIKey{ID: "k1", Owner: "bob", Hash: []byte("h2")})
		}, errs.AlreadyExists},
		{"create duplicate api key hash", func() error {
			return s.CreateAPIKey(ctx, store.APIKey{ID: "k2", Owner: "bob", Hash: []byte("h1")})
		}, errs.AlreadyExists},
		{"lookup missing api key", func() error { _, err := s.LookupAPIKey(ctx, []byte("nope")); return err }, errs.NotFound},
		{"delete missing api key", func() error { return s.DeleteAPIKey(ctx, "nope") }, errs.NotFound},
		{"get missing template", func() error { _, err := s.GetTemplate(ctx, "nope"); return err }, errs.NotFound},
		{"delete missing template", func() error { return s.DeleteTemplate(ctx, "nope") }, errs.NotFound},
		{"put template bad state", func() error { _, err := s.PutTemplate(ctx, store.Template{Name: "t", State: "done"}); return err }, errs.InvalidArgument},
		{"get missing setting", func() error { _, err := s.GetSetting(ctx, "nope"); return err }, errs.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatalf("err = nil, want kind %v", tc.want)
			}
			if got := errs.KindOf(err); got != tc.want {
				t.Errorf("kind = %v (err %v), want %v", got, err, tc.want)
			}
		})
	}
}

// seedList creates sandboxes a..f with distinct owners/states/labels/templates.
func seedList(t *testing.T, s store.Store) {
	mk := func(id, owner string, min int, st sandbox.State, tmpl string, labels map[string]string) *sandbox.Sandbox {
		sb := suiteSandbox(id, owner, suiteEpoch.Add(time.Duration(min)*time.Minute))
		sb.State, sb.Template, sb.Labels = st, tmpl, labels
		return sb
	}
	mustCreate(t, s,
		mk("a", "alice", 1, sandbox.Running, "py", map[string]string{"team": "ml", "env": "prod"}),
		mk("b", "alice", 2, sandbox.Paused, "py", map[string]string{"team": "ml", "env": "dev"}),
		mk("c", "bob", 3, sandbox.Running, "node", map[string]string{"team": "web"}),
		mk("d", "alice", 4, sandbox.Stopped, "node", nil),
		mk("e", "bob", 5, sandbox.Failed, "py", map[string]string{"team": "ml", "x.io/k-1": "v"}),
		noExpiry(mk("f", "carol", 6, sandbox.Running, "py", map[string]string{})),
	)
}

func noExpiry(sb *sandbox.Sandbox) *sandbox.Sandbox {
	sb.ExpiresAt = time.Time{}
	return sb
}

func suiteListFilters(t *testing.T, s store.Store) {
	seedList(t, s)
	for _, tc := range []struct {
		name string
		f    store.SandboxFilter
		want []string
	}{
		{"all", store.SandboxFilter{}, []string{"a", "b", "c", "d", "e", "f"}},
		{"owner", store.SandboxFilter{Owner: "alice"}, []string{"a", "b", "d"}},
		{"unknown owner", store.SandboxFilter{Owner: "zed"}, []string{}},
		{"one state", store.SandboxFilter{States: []sandbox.State{sandbox.Running}}, []string{"a", "c", "f"}},
		{"two states", store.SandboxFilter{States: []sandbox.State{sandbox.Paused, sandbox.Failed}}, []string{"b", "e"}},
		{"template", store.SandboxFilter{Template: "node"}, []string{"c", "d"}},
		{"one label", store.SandboxFilter{Labels: map[string]string{"team": "ml"}}, []string{"a", "b", "e"}},
		{"all labels must match", store.SandboxFilter{Labels: map[string]string{"team": "ml", "env": "dev"}}, []string{"b"}},
		{"label key with dots and slash", store.SandboxFilter{Labels: map[string]string{"x.io/k-1": "v"}}, []string{"e"}},
		{"label value mismatch", store.SandboxFilter{Labels: map[string]string{"team": "ops"}}, []string{}},
		{"created after", store.SandboxFilter{CreatedAfter: suiteEpoch.Add(4 * time.Minute)}, []string{"e", "f"}},
		// Each expires an hour after its creation, except f: never.
		{"expires by", store.SandboxFilter{ExpiresBy: suiteEpoch.Add(time.Hour + 3*time.Minute)}, []string{"a", "b", "c"}},
		{"expires by, no expiry never matches", store.SandboxFilter{ExpiresBy: suiteEpoch.Add(100 * time.Hour)}, []string{"a", "b", "c", "d", "e"}},
		{"expires by and state", store.SandboxFilter{ExpiresBy: suiteEpoch.Add(100 * time.Hour), States: []sandbox.State{sandbox.Running}}, []string{"a", "c"}},
		{"combined", store.SandboxFilter{Owner: "alice", States: []sandbox.State{sandbox.Running, sandbox.Paused}, Labels: map[string]string{"team": "ml"}, Template: "py"}, []string{"a", "b"}},
		{"desc", store.SandboxFilter{Order: store.OrderDesc}, []string{"f", "e", "d", "c", "b", "a"}},
		{"desc owner", store.SandboxFilter{Owner: "bob", Order: store.OrderDesc}, []string{"e", "c"}},
		{"limit without more", store.SandboxFilter{Limit: 6}, []string{"a", "b", "c", "d", "e", "f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := s.ListSandboxes(t.Context(), tc.f)
			if err != nil {
				t.Fatalf("ListSandboxes: %v", err)
			}
			if diff := cmp.Diff(tc.want, ids(got)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
			if next != "" {
				t.Errorf("next = %q, want \"\" (no more pages)", next)
			}
		})
	}
}

func suitePagination(t *testing.T, s store.Store) {
	// Five sandboxes; c and d share a creation time, so the id breaks the tie.
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		min := i
		if id == "d" {
			min = 2
		}
		mustCreate(t, s, suiteSandbox(id, "alice", suiteEpoch.Add(time.Duration(min)*time.Minute)))
	}
	mustCreate(t, s, suiteSandbox("z", "bob", suiteEpoch)) // filtered out by owner
	for _, tc := range []struct {
		order string
		want  [][]string
	}{
		{store.OrderAsc, [][]string{{"a", "b"}, {"c", "d"}, {"e"}}},
		{"", [][]string{{"a", "b"}, {"c", "d"}, {"e"}}},
		{store.OrderDesc, [][]string{{"e", "d"}, {"c", "b"}, {"a"}}},
	} {
		t.Run("order="+tc.order, func(t *testing.T) {
			var pages [][]string
			after := ""
			for range 10 {
				got, next, err := s.ListSandboxes(t.Context(), store.SandboxFilter{Owner: "alice", Order: tc.order, Limit: 2, After: after})
				if err != nil {
					t.Fatalf("ListSandboxes(after=%q): %v", after, err)
				}
				pages = append(pages, ids(got))
				if next == "" {
					break
				}
				after = next
			}
			if diff := cmp.Diff(tc.want, pages); diff != "" {
				t.Errorf("pages (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("cursor survives deletion of its item", func(t *testing.T) {
		ctx := t.Context()
		_, next, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "alice", Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteSandbox(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		got, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Owner: "alice", Limit: 2, After: next})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"c", "d"}, ids(got)); diff != "" {
			t.Errorf("page after deleted cursor item (-want +got):\n%s", diff)
		}
	})
}

func suiteTransitionLegal(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sb", "alice", suiteEpoch))
	started := suiteEpoch.Add(2 * time.Second)
	got, err := s.Transition(ctx, "sb", sandbox.Running,
		sandbox.Event{Time: started, Actor: "daemon", Reason: "created", Data: map[string]string{"ms": "40"}},
		func(sb *sandbox.Sandbox) error { sb.StartedAt = started; sb.Reason = "created"; return nil })
	if err != nil {
		t.Fatalf("Transition: %v", err)
	}
	want := suiteSandbox("sb", "alice", suiteEpoch)
	want.State, want.StartedAt, want.Reason, want.Version = sandbox.Running, started, "created", 2
	if diff := cmp.Diff(want, got, suiteOpts); diff != "" {
		t.Errorf("Transition result (-want +got):\n%s", diff)
	}
	stored, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, stored, suiteOpts); diff != "" {
		t.Errorf("stored after Transition (-want +got):\n%s", diff)
	}
	// nil fn, and a second event type.
	if _, err := s.Transition(ctx, "sb", sandbox.Paused, sandbox.Event{Time: started.Add(time.Second), Type: "pause", Actor: "reaper"}, nil); err != nil {
		t.Fatalf("Transition to paused: %v", err)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{SandboxID: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	wantEvs := []sandbox.Event{
		{SandboxID: "sb", Owner: "alice", Time: started, Actor: "daemon", Type: "transition", From: sandbox.Creating, To: sandbox.Running, Reason: "created", Data: map[string]string{"ms": "40"}},
		{SandboxID: "sb", Owner: "alice", Time: started.Add(time.Second), Actor: "reaper", Type: "pause", From: sandbox.Running, To: sandbox.Paused},
	}
	if diff := cmp.Diff(wantEvs, evs, suiteOpts, cmpopts.IgnoreFields(sandbox.Event{}, "Seq")); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func suiteTransitionIllegal(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sb", "alice", suiteEpoch))
	before, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("illegal move", func(t *testing.T) {
		called := false
		_, err := s.Transition(ctx, "sb", sandbox.Paused, sandbox.Event{Actor: "x"}, func(*sandbox.Sandbox) error { called = true; return nil })
		var te *sandbox.TransitionError
		if !errors.As(err, &te) {
			t.Fatalf("err = %v (%T), want *sandbox.TransitionError", err, err)
		}
		if diff := cmp.Diff(&sandbox.TransitionError{From: sandbox.Creating, To: sandbox.Paused}, te); diff != "" {
			t.Errorf("TransitionError (-want +got):\n%s", diff)
		}
		if !errs.Is(err, errs.Conflict) {
			t.Errorf("kind = %v, want Conflict", errs.KindOf(err))
		}
		if called {
			t.Error("fn was called for an illegal transition")
		}
	})
	t.Run("fn error", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := s.Transition(ctx, "sb", sandbox.Running, sandbox.Event{}, func(sb *sandbox.Sandbox) error { sb.Message = "half"; return boom })
		if err != boom {
			t.Fatalf("err = %v, want the fn's error as is", err)
		}
	})
	after, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after, suiteOpts); diff != "" {
		t.Errorf("sandbox changed by failed transitions (-before +after):\n%s", diff)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{SandboxID: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 0 {
		t.Errorf("failed transitions wrote events: %+v", evs)
	}
}

func suiteUpdateRollback(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sb", "alice", suiteEpoch))
	before, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	boom := errs.E(errs.FailedPrecondition, "not now")
	got, err := s.UpdateSandbox(ctx, "sb", func(sb *sandbox.Sandbox) error {
		sb.State, sb.Message, sb.Labels["app"] = sandbox.Failed, "half-written", "changed"
		return boom
	})
	if err != boom {
		t.Errorf("err = %v, want the fn's error as is", err)
	}
	if got != nil {
		t.Errorf("result = %+v, want nil on error", got)
	}
	after, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after, suiteOpts); diff != "" {
		t.Errorf("sandbox changed by rolled-back update (-before +after):\n%s", diff)
	}
}

func suiteUpdateConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustCreate(t, s, suiteSandbox("sb", "alice", suiteEpoch))
	const n = 20
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := s.UpdateSandbox(ctx, "sb", func(sb *sandbox.Sandbox) error {
				sb.PauseMillis++ // any typed attr: a lost update would show as a low count
				return nil
			})
			errc <- err
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Errorf("UpdateSandbox: %v", err)
		}
	}
	got, err := s.GetSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{strconv.Itoa(n), strconv.Itoa(n + 1)},
		[]string{strconv.FormatInt(got.PauseMillis, 10), strconv.FormatInt(got.Version, 10)}); diff != "" {
		t.Errorf("counter, version (-want +got):\n%s", diff)
	}
}

package kubestore

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

var epoch = time.Date(2026, 3, 1, 10, 0, 0, 987654321, time.UTC)

func newStore(t *testing.T, ns string) *Store {
	t.Helper()
	if ns == "" {
		ns = srv.Namespace(t)
	}
	s, err := Open(t.Context(), srv.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rawSandbox(t *testing.T, s *Store, id string) berthv1.Sandbox {
	t.Helper()
	var o berthv1.Sandbox
	if err := srv.Client.Get(t.Context(), berthv1.Sandboxes, s.ns, id, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

func cond(t *testing.T, o berthv1.Sandbox, typ string) kube.Condition {
	t.Helper()
	c := kube.FindCondition(o.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no condition %s in %+v", typ, o.Status.Conditions)
	}
	return *c
}

// The object is what a kubectl user reads: typed fields, selectable
// labels, conditions whose transition times move only with their status;
// labels someone else put on it survive the store's writes.
func TestSandboxObject(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, "")
	clock := epoch
	s.now = func() time.Time { return clock }
	tok := strings.Repeat("ab", 32) // a hex SHA-256: 64 characters, over a label value's 63
	in := &sandbox.Sandbox{
		ID: "sb1", Owner: "alice@example.com", Template: "python", TemplateID: "sha256:ff", Runtime: "runsc",
		State: sandbox.Creating, Labels: map[string]string{"team": "ml"}, Env: map[string]string{"A": "1"},
		Resources: sandbox.Resources{CPUMillis: 1500, MemoryMiB: 2048, DiskMiB: 4096, Pids: 128},
		CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour), ExpiryAction: sandbox.ExpirePause, AccessTokenHash: tok,
		Attrs: sandbox.Attrs{Cluster: sandbox.ClusterState{Node: "node-a", ExpectedDuration: "5m0s",
			DurationClass: berthv1.ClassShort, BoundAt: epoch.Add(time.Millisecond)}},
	}
	if err := s.CreateSandbox(ctx, in); err != nil {
		t.Fatal(err)
	}
	o := rawSandbox(t, s, "sb1")
	got := map[string]string{
		"owner": o.Spec.Owner, "template": o.Spec.Template, "fingerprint": o.Spec.TemplateFingerprint,
		"nodeName": o.Spec.NodeName, "class": o.Spec.DurationClass, "state": o.Status.State, "node": o.Status.Node,
		"label owner": o.Labels[berthv1.LabelOwner], "label state": o.Labels[berthv1.LabelState],
		"label template": o.Labels[berthv1.LabelTemplate], "label node": o.Labels[berthv1.LabelNode],
		"label token": o.Labels[labelToken], "spec label": o.Spec.Labels["team"],
	}
	want := map[string]string{
		"owner": "alice@example.com", "template": "python", "fingerprint": "sha256:ff", "nodeName": "node-a",
		"class": "short", "state": "creating", "node": "node-a",
		"label owner": LabelValue("alice@example.com"), "label state": "creating", "label template": "python",
		"label node": "node-a", "label token": LabelValue(tok), "spec label": "ml",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("object fields (-want +got):\n%s", d)
	}
	if o.Spec.Resources.CPUMillis != 1500 || o.Status.Timings.CreatedAt == nil || !o.Status.Timings.CreatedAt.Equal(epoch) {
		t.Errorf("resources / timings = %+v / %+v", o.Spec.Resources, o.Status.Timings)
	}
	if c := cond(t, o, berthv1.CondScheduled); c.Status != "True" || c.Reason != "Bound" {
		t.Errorf("Scheduled = %+v", c)
	}
	if c := cond(t, o, berthv1.CondReady); c.Status != "False" || c.Reason != "Creating" {
		t.Errorf("Ready = %+v", c)
	}
	if c := cond(t, o, berthv1.CondLost); c.Status != "False" {
		t.Errorf("NodeLost = %+v", c)
	}

	// Someone else labels the object; the next write keeps it.
	if err := srv.Client.Patch(ctx, berthv1.Sandboxes, s.ns, "sb1", kube.MergePatch,
		[]byte(`{"metadata":{"labels":{"example.com/cost-centre":"42"}}}`), "", nil); err != nil {
		t.Fatal(err)
	}
	clock = epoch.Add(time.Minute)
	if _, err := s.Transition(ctx, "sb1", sandbox.Running, sandbox.Event{Actor: "node"}, nil); err != nil {
		t.Fatal(err)
	}
	o = rawSandbox(t, s, "sb1")
	if o.Labels["example.com/cost-centre"] != "42" || o.Labels[berthv1.LabelState] != "running" {
		t.Errorf("labels after a write = %v", o.Labels)
	}
	if c := cond(t, o, berthv1.CondReady); c.Status != "True" || !c.LastTransitionTime.Equal(clock) {
		t.Errorf("Ready after running = %+v, want True since %v", c, clock)
	}
	if c := cond(t, o, berthv1.CondScheduled); !c.LastTransitionTime.Equal(epoch) {
		t.Errorf("Scheduled moved its transition time: %+v", c)
	}

	lostAt := epoch.Add(2 * time.Minute)
	clock = lostAt
	if _, err := s.Transition(ctx, "sb1", sandbox.Lost, sandbox.Event{Actor: "replica", Reason: "node_lost"},
		func(sb *sandbox.Sandbox) error { sb.Reason, sb.Attrs.Cluster.LostAt = "node_lost", lostAt; return nil }); err != nil {
		t.Fatal(err)
	}
	o = rawSandbox(t, s, "sb1")
	if c := cond(t, o, berthv1.CondLost); c.Status != "True" || c.Reason != "LeaseExpired" {
		t.Errorf("NodeLost after lost = %+v", c)
	}
	if o.Status.Timings.LostAt == nil || !o.Status.Timings.LostAt.Equal(lostAt) || o.Status.Reason != "node_lost" {
		t.Errorf("status after lost = %+v", o.Status)
	}

	// Every field reads back as written.
	wantSB := *in
	wantSB.State, wantSB.Reason, wantSB.Version = sandbox.Lost, "node_lost", 3
	wantSB.Attrs.Cluster.LostAt = lostAt
	sb, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&wantSB, sb, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("GetSandbox (-want +got):\n%s", d)
	}
	if byTok, err := s.SandboxByTokenHash(ctx, tok); err != nil || byTok.ID != "sb1" {
		t.Errorf("SandboxByTokenHash(64 chars) = %v, %v", byTok, err)
	}

	// SandboxesOnNode: what node-a's agent is told it runs.
	other := *in
	other.ID, other.AccessTokenHash, other.Attrs.Cluster.Node = "sb2", "", "node-b"
	unbound := *in
	unbound.ID, unbound.AccessTokenHash, unbound.Attrs.Cluster = "sb3", "", sandbox.ClusterState{}
	for _, sb := range []*sandbox.Sandbox{&other, &unbound} {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if c := cond(t, rawSandbox(t, s, "sb3"), berthv1.CondScheduled); c.Status != "False" || c.Reason != "Unschedulable" {
		t.Errorf("Scheduled of an unbound sandbox = %+v", c)
	}
	for node, want := range map[string][]string{"node-a": {"sb1"}, "node-b": {"sb2"}, "node-c": {}} {
		sbs, err := s.SandboxesOnNode(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{}
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		if d := cmp.Diff(want, ids); d != "" {
			t.Errorf("SandboxesOnNode(%s) (-want +got):\n%s", node, d)
		}
	}
	if _, err := s.SandboxesOnNode(ctx, ""); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("SandboxesOnNode(\"\") = %v, want InvalidArgument", err)
	}
}

// Ids from clients never become paths: ".." and friends are NotFound
// without reaching the collection.
func TestHostileIDs(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, "")
	if err := s.CreateSandbox(ctx, &sandbox.Sandbox{ID: "keep", Owner: "a", State: sandbox.Creating}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"..", ".", "../keep", "keep/status", "%2e%2e", ""} {
		if _, err := s.GetSandbox(ctx, id); !errs.Is(err, errs.NotFound) {
			t.Errorf("GetSandbox(%q) = %v, want NotFound", id, err)
		}
		if _, err := s.UpdateSandbox(ctx, id, func(*sandbox.Sandbox) error { return nil }); !errs.Is(err, errs.NotFound) {
			t.Errorf("UpdateSandbox(%q) = %v, want NotFound", id, err)
		}
		if err := s.DeleteSandbox(ctx, id); !errs.Is(err, errs.NotFound) {
			t.Errorf("DeleteSandbox(%q) = %v, want NotFound", id, err)
		}
	}
	if _, err := s.GetSandbox(ctx, "keep"); err != nil {
		t.Errorf("keep after the attempts: %v", err)
	}
}

// A delete that removed the object but not its records (a crash, a lost
// connection) is finished by calling it again.
func TestDeleteSandboxFinishesOnRetry(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, "")
	if err := s.CreateSandbox(ctx, &sandbox.Sandbox{ID: "sb", Owner: "a", State: sandbox.Creating}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateCheckpoint(ctx, store.Checkpoint{ID: "ck", Sandbox: "sb", Owner: "a", Name: "one", Layer: "l", Layers: []string{"l"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTimelineHead(ctx, store.TimelineHead{Sandbox: "sb", Checkpoint: "ck"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "sb", Owner: "a", Type: "note"}); err != nil {
		t.Fatal(err)
	}
	// Half a delete: the object only.
	if err := srv.Client.Delete(ctx, berthv1.Sandboxes, s.ns, "sb", kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetCheckpoint(ctx, "ck"); err != nil {
		t.Fatalf("the orphan checkpoint this test needs: %v", err)
	}
	if err := s.DeleteSandbox(ctx, "sb"); !errs.Is(err, errs.NotFound) {
		t.Errorf("DeleteSandbox of a half-deleted sandbox = %v, want NotFound", err)
	}
	if _, err := s.GetCheckpoint(ctx, "ck"); !errs.Is(err, errs.NotFound) {
		t.Errorf("checkpoint after the retried delete = %v, want NotFound", err)
	}
	if _, err := s.GetTimelineHead(ctx, "sb"); !errs.Is(err, errs.NotFound) {
		t.Errorf("head after the retried delete = %v, want NotFound", err)
	}
	// The id is fresh again: its checkpoints count from 1, its name is free.
	if err := s.CreateSandbox(ctx, &sandbox.Sandbox{ID: "sb", Owner: "a", State: sandbox.Creating}); err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateCheckpoint(ctx, store.Checkpoint{ID: "ck2", Sandbox: "sb", Owner: "a", Name: "one", Layer: "l", Layers: []string{"l"}})
	if err != nil || c.Seq != 1 {
		t.Errorf("checkpoint of the new sandbox = seq %d, %v; want 1", c.Seq, err)
	}
	if evs, err := s.ListEvents(ctx, store.EventFilter{SandboxID: "sb"}); err != nil || len(evs) != 1 {
		t.Errorf("events after delete = %+v, %v; want the one note (events outlive)", evs, err)
	}
}

// A claim whose holder is gone (a crash between a row's removal and its
// claim's) does not block the name for ever.
func TestStaleClaimsAreTakenOver(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, "")
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s1", Owner: "alice", Name: "base", Layers: []string{"l"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.remove(ctx, tableSnapshots, "s1"); err != nil { // the row goes, its claim stays
		t.Fatal(err)
	}
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s2", Owner: "alice", Name: "base", Layers: []string{"l"}}); err != nil {
		t.Errorf("name of a vanished snapshot: %v", err)
	}
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s3", Owner: "alice", Name: "base", Layers: []string{"l"}}); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("name of a live snapshot = %v, want AlreadyExists", err)
	}
	if _, err := s.GetSnapshot(ctx, "s3"); !errs.Is(err, errs.NotFound) {
		t.Errorf("refused snapshot's row = %v, want NotFound (undone)", err)
	}

	if err := s.CreateSandbox(ctx, &sandbox.Sandbox{ID: "tgt", Owner: "alice", State: sandbox.Running}); err != nil {
		t.Fatal(err)
	}
	m := store.Merge{ID: "m1", Owner: "alice", Target: "tgt", State: store.MergePlanned}
	if err := s.CreateMerge(ctx, m, nil); err != nil {
		t.Fatal(err)
	}
	// m1 closed by a writer that died before releasing the target.
	var cur store.Merge
	if err := s.update(ctx, tableMerges, "m1", &cur, func() map[string]string { return ownedBy("tgt", map[string]string{"target": "tgt"}) },
		func() error { cur.State = store.MergeAborted; return nil }); err != nil {
		t.Fatal(err)
	}
	m.ID = "m2"
	if err := s.CreateMerge(ctx, m, nil); err != nil {
		t.Errorf("open merge after a closed one kept the claim: %v", err)
	}
	m.ID = "m3"
	if err := s.CreateMerge(ctx, m, nil); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("second open merge = %v, want AlreadyExists", err)
	}
}

// Two replicas (two Stores, each with its counter cache) appending at
// once never hand out a seq twice.
func TestSeqAcrossReplicas(t *testing.T) {
	ctx := t.Context()
	a := newStore(t, "")
	b := newStore(t, a.ns)
	const n = 12
	var (
		mu   sync.Mutex
		seen = map[int64]bool{}
		wg   sync.WaitGroup
	)
	for i := range 2 * n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			seq, err := s.AppendEvent(ctx, sandbox.Event{SandboxID: "x", Type: "note"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[seq] {
				t.Errorf("seq %d handed out twice", seq)
			}
			seen[seq] = true
		})
	}
	wg.Wait()
	evs, err := b.ListEvents(ctx, store.EventFilter{SandboxID: "x"})
	if err != nil || len(evs) != 2*n {
		t.Fatalf("ListEvents = %d, %v; want %d", len(evs), err, 2*n)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Errorf("seq %d after %d", evs[i].Seq, evs[i-1].Seq)
		}
	}
}

// Template object names are the name when it is DNS-safe, a hash
// otherwise (a name shaped like a hash included); an object made by hand
// under a template's name is neither read as it nor overwritten.
func TestTemplateObjectNames(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, "")
	hashLike := "h." + strings.Repeat("0", 40)
	for _, tc := range []struct{ name, object string }{
		{"python", "python"},
		{"py.3-12", "py.3-12"},
		{"My Template/1", templateObjectName("My Template/1")},
		{hashLike, templateObjectName(hashLike)},
	} {
		if _, err := s.PutTemplate(ctx, store.Template{Name: tc.name, State: store.TemplateReady}); err != nil {
			t.Fatalf("PutTemplate(%q): %v", tc.name, err)
		}
		var o berthv1.Template
		if err := srv.Client.Get(ctx, berthv1.Templates, s.ns, tc.object, &o); err != nil || o.Spec.Name != tc.name {
			t.Errorf("object %s = %+v, %v; want spec.name %q", tc.object, o.Spec, err, tc.name)
		}
		if c := kube.FindCondition(o.Status.Conditions, "Ready"); c == nil || c.Status != "True" {
			t.Errorf("template %q Ready = %+v", tc.name, c)
		}
	}
	if templateObjectName(hashLike) == hashLike || !hashedNameRe.MatchString(templateObjectName("My Template/1")) {
		t.Errorf("hashed names: %q, %q", templateObjectName(hashLike), templateObjectName("My Template/1"))
	}
	hand := berthv1.Template{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Template"},
		ObjectMeta: kube.ObjectMeta{Name: "handmade"}, Spec: berthv1.TemplateSpec{Name: "something-else"}}
	if err := srv.Client.Create(ctx, berthv1.Templates, s.ns, hand, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTemplate(ctx, "handmade"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetTemplate(handmade) = %v, want NotFound", err)
	}
	if _, err := s.PutTemplate(ctx, store.Template{Name: "handmade", State: store.TemplateReady}); !errs.Is(err, errs.AlreadyExists) {
		t.Errorf("PutTemplate over a foreign object = %v, want AlreadyExists", err)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil || len(list) != 4 {
		t.Errorf("ListTemplates = %d, %v; want the 4 of the store", len(list), err)
	}
}

// A sandbox whose extras pass what an object's annotations can hold is
// refused with a reason, not the API server's field error.
func TestSandboxTooLarge(t *testing.T) {
	s := newStore(t, "")
	sb := &sandbox.Sandbox{ID: "big", Owner: "a", State: sandbox.Creating, Env: map[string]string{"X": strings.Repeat("x", 300<<10)}}
	if err := s.CreateSandbox(t.Context(), sb); !errs.Is(err, errs.ResourceExhausted) {
		t.Errorf("CreateSandbox with a 300 KiB env = %v, want ResourceExhausted", err)
	}
}

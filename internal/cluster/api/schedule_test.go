package api

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/placement"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestParseExpected(t *testing.T) {
	for _, tc := range []struct {
		in        string
		class     placement.Class
		d         time.Duration
		wantField string
	}{
		{in: ""},
		{in: "short", class: placement.Short},
		{in: " long ", class: placement.Long},
		{in: "interactive", class: placement.Interactive},
		{in: "45m", d: 45 * time.Minute},
		{in: "1d", d: 24 * time.Hour},
		{in: "90", d: 90 * time.Second},
		{in: "0", wantField: "expected_duration"},
		{in: "forever", wantField: "expected_duration"},
		{in: "-5m", wantField: "expected_duration"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, d, err := parseExpected("expected_duration", tc.in)
			if tc.wantField != "" {
				if errs.FieldOf(err) != tc.wantField {
					t.Fatalf("err = %v, want a field error on %s", err, tc.wantField)
				}
				return
			}
			if err != nil || c != tc.class || d != tc.d {
				t.Fatalf("got %q %s %v, want %q %s", c, d, err, tc.class, tc.d)
			}
		})
	}
}

// TestCreateToPlacement: the REST and E2B bodies map onto the placement
// request the scheduler asks with.
func TestCreateToPlacement(t *testing.T) {
	alice := auth.Principal{Owner: "alice"}
	admin := auth.Principal{Owner: "admin", Admin: true}
	for _, tc := range []struct {
		name      string
		body      string
		p         auth.Principal
		e2b       bool
		want      placement.Request
		wantTTL   time.Duration
		wantField string
	}{
		{name: "empty body gets the node defaults", body: ``, p: alice,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice", Fingerprint: "fp"}},
		{name: "resources, runtime, labels, class", p: alice,
			body: `{"template":"py","runtime":"runsc","cpu":2.5,"memory_mib":4096,"disk_mib":10240,"labels":{"node.berth.dev/zone":"eu"},"expected_duration":"interactive","ttl":"2h"}`,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 2500, MemoryMiB: 4096, DiskMiB: 10240}, Runtime: "runsc",
				Owner: "alice", Fingerprint: "fp", Class: placement.Interactive, Labels: map[string]string{"node.berth.dev/zone": "eu"}},
			wantTTL: 2 * time.Hour},
		{name: "a duration", p: alice, body: `{"expected_duration":"3h"}`,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice", Fingerprint: "fp", Expected: 3 * time.Hour}},
		{name: "admin for another owner", p: admin, body: `{"owner":"bob"}`,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "bob", Fingerprint: "fp"}},
		{name: "tenant for another owner", p: alice, body: `{"owner":"bob"}`, wantField: "owner"},
		{name: "unknown field", p: alice, body: `{"colour":"red"}`, wantField: "colour"},
		{name: "bad expected", p: alice, body: `{"expected_duration":"soon"}`, wantField: "expected_duration"},
		{name: "negative cpu", p: alice, body: `{"cpu":-1}`, wantField: "cpu"},
		{name: "tiny memory", p: alice, body: `{"memory_mib":3}`, wantField: "memory"},
		{name: "bad ttl", p: alice, body: `{"ttl":"later"}`, wantField: "ttl"},
		{name: "e2b base template, metadata, timeout", p: alice, e2b: true,
			body: `{"templateID":"base","timeout":60,"metadata":{"k":"v"},"envVars":{"A":"1"},"secure":true}`,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice",
				Fingerprint: "fp", Labels: map[string]string{"k": "v"}},
			wantTTL: time.Minute},
		{name: "e2b v2 default timeout", p: alice, e2b: true, body: `{"templateID":"py"}`,
			want:    placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice", Fingerprint: "fp"},
			wantTTL: 300 * time.Second},
		{name: "e2b without a template", p: alice, e2b: true, body: `{}`, wantField: "templateID"},
		{name: "e2b mistyped metadata", p: alice, e2b: true, body: `{"templateID":"py","metadata":["x"]}`, wantField: "metadata"},
		{name: "e2b negative timeout", p: alice, e2b: true, body: `{"templateID":"py","timeout":-5}`,
			want: placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice", Fingerprint: "fp"}},
		{name: "e2b huge timeout is capped", p: alice, e2b: true, body: `{"templateID":"py","timeout":99999999999}`,
			want:    placement.Request{Resources: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}, Owner: "alice", Fingerprint: "fp"},
			wantTTL: 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec createSpec
			var err error
			if tc.e2b {
				spec, err = e2bSpec([]byte(tc.body), tc.p.Owner, "default", true)
			} else {
				spec, err = restSpec([]byte(tc.body), tc.p)
			}
			if tc.wantField != "" {
				if errs.FieldOf(err) != tc.wantField {
					t.Fatalf("err = %v (field %q), want a field error on %s", err, errs.FieldOf(err), tc.wantField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec.TTL != tc.wantTTL {
				t.Errorf("ttl = %s, want %s", spec.TTL, tc.wantTTL)
			}
			if diff := cmp.Diff(tc.want, placementRequest("", spec, "fp")); diff != "" {
				t.Errorf("placement request (-want +got):\n%s", diff)
			}
		})
	}
}

func lease(renew time.Time, secs int32) *kube.Lease {
	return &kube.Lease{Spec: kube.LeaseSpec{RenewTime: &kube.MicroTime{Time: renew}, LeaseDurationSeconds: &secs}}
}

func node(name string, ready string, reason string) berthv1.Node {
	n := berthv1.Node{ObjectMeta: kube.ObjectMeta{Name: name}}
	n.Status.Capacity = berthv1.Resources{CPUMillis: 8000, MemoryMiB: 16384, DiskMiB: 100000}
	n.Status.Runtimes = []berthv1.NodeRuntime{{Name: "runc", Capabilities: []string{"memory-checkpoint"}}, {Name: "runsc"}}
	if ready != "" {
		n.Status.Conditions = []kube.Condition{{Type: berthv1.CondNodeReady, Status: ready, Reason: reason}}
	}
	return n
}

func TestPlacementNodes(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fresh, stale := lease(now.Add(-5*time.Second), 40), lease(now.Add(-time.Minute), 40)
	cordoned := node("cordoned", "True", "")
	cordoned.Spec.Unschedulable = true
	busy := node("busy", "True", "")
	busy.Status.Allocated = berthv1.Resources{MemoryMiB: 1024, DiskMiB: 4096}
	busy.Status.CachedTemplates = []string{"fp"}
	busy.Status.WarmPools = []berthv1.NodeWarmPool{{Fingerprint: "fp", Ready: 2}}
	busy.Labels = map[string]string{"zone": "eu"}
	nodes := []berthv1.Node{node("ok", "True", ""), node("stale", "True", ""), node("lost", "False", ReasonLeaseExpired),
		node("noready", "", ""), cordoned, busy, node("nolease", "True", "")}
	leases := map[string]*kube.Lease{"ok": fresh, "stale": stale, "lost": stale, "noready": fresh, "cordoned": fresh, "busy": fresh}
	mk := func(id string, st sandbox.State, mem int64, class string, exp string, bound time.Time) *sandbox.Sandbox {
		sb := &sandbox.Sandbox{ID: id, Owner: "alice", State: st, Resources: sandbox.Resources{CPUMillis: 2000, MemoryMiB: mem, DiskMiB: 1000}}
		sb.Attrs.Cluster = sandbox.ClusterState{Node: "busy", DurationClass: class, ExpectedDuration: exp, BoundAt: bound}
		return sb
	}
	bound := map[string][]*sandbox.Sandbox{"busy": {
		mk("a", sandbox.Running, 2048, "long", "2h0m0s", now.Add(-time.Hour)),
		mk("b", sandbox.Creating, 1024, "short", "", now),
		mk("c", sandbox.Stopped, 8192, "short", "", now),                      // holds no memory
		mk("d", sandbox.Running, 512, "", "10m0s", now.Add(-time.Hour)),       // overdue: ends now
		mk("e", sandbox.Lost, 4096, "interactive", "", now.Add(-2*time.Hour)), // holds nothing
	}}
	got := placementNodes(nodes, leases, bound, "runc", DefaultResources, placement.DefaultPolicy(), now)
	exp := func(l *kube.Lease) time.Time { return leaseExpiry(l) }
	caps := []string{"memory-checkpoint"}
	base := func(name string, ready, lost bool, l *kube.Lease) placement.Node {
		return placement.Node{Name: name, Capacity: placement.Resources{CPUMillis: 8000, MemoryMiB: 16384, DiskMiB: 100000},
			Runtimes: []string{"runc", "runsc"}, Capabilities: caps, Ready: ready, Lost: lost, LeaseExpires: exp(l)}
	}
	wantBusy := base("busy", true, false, fresh)
	wantBusy.Allocated = placement.Resources{MemoryMiB: 2048 + 1024 + 512, DiskMiB: 4096} // objects hold more memory than the report
	wantBusy.Labels = map[string]string{"zone": "eu"}
	wantBusy.Cached = []string{"fp"}
	wantBusy.Pools = []placement.Pool{{Fingerprint: "fp", Ready: 2, Each: placement.Resources{CPUMillis: 1000, MemoryMiB: 512, DiskMiB: 2048}}}
	wantBusy.Running = []placement.Running{
		{ID: "a", Owner: "alice", CPUMillis: 2000, MemoryMiB: 2048, Class: placement.Long, EndsAt: now.Add(time.Hour)},
		{ID: "b", Owner: "alice", CPUMillis: 2000, MemoryMiB: 1024, Class: placement.Short, EndsAt: now.Add(2 * time.Minute)},
		{ID: "d", Owner: "alice", CPUMillis: 2000, MemoryMiB: 512, Class: placement.Short, EndsAt: now},
	}
	want := []placement.Node{
		base("ok", true, false, fresh),
		base("stale", false, false, stale),
		base("lost", false, true, stale),
		base("noready", false, false, fresh),
		base("cordoned", false, false, fresh),
		wantBusy,
		base("nolease", false, false, nil),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("placement nodes (-want +got):\n%s", diff)
	}

	// And Place over them: only ok and busy may take work; the warm
	// member and the cache send a default-shaped request of fp to busy.
	dec, err := placement.Place(placementRequest("x", createSpec{Owner: "bob"}, "fp"), got, now)
	if err != nil || dec.Node != "busy" || !dec.WarmHit {
		t.Fatalf("Place = %+v, %v; want busy with a warm hit", dec, err)
	}
	// A request no ready node fits names why.
	_, err = placement.Place(placementRequest("y", createSpec{Owner: "bob", Resources: sandbox.Resources{MemoryMiB: 20000}}, "fp"), got, now)
	if !errs.Is(err, errs.ResourceExhausted) {
		t.Fatalf("Place of 20000 MiB: %v, want ResourceExhausted", err)
	}
	if msg := err.Error(); msg != "no node fits (of 7): not ready on 5 nodes, memory on 2 nodes (needs 20000 MiB, at most 16384 MiB free)" {
		t.Fatalf("NoFit message: %s", msg)
	}
}

func TestLossDecision(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-10 * time.Minute)
	young := now.Add(-5 * time.Second)
	withBirth := func(n berthv1.Node, t time.Time) *berthv1.Node { n.CreationTimestamp = &t; return &n }
	for _, tc := range []struct {
		name       string
		n          *berthv1.Node
		l          *kube.Lease
		lost, mark bool
	}{
		{"fresh lease", withBirth(node("n", "True", ""), old), lease(now.Add(-10*time.Second), 40), false, false},
		{"expires exactly now", withBirth(node("n", "True", ""), old), lease(now.Add(-40*time.Second), 40), true, true},
		{"expired, still ready", withBirth(node("n", "True", ""), old), lease(now.Add(-41*time.Second), 40), true, true},
		{"expired, marked already", withBirth(node("n", "False", ReasonLeaseExpired), old), lease(old, 40), true, false},
		{"expired, not ready for another reason", withBirth(node("n", "False", "Draining"), old), lease(old, 40), true, true},
		{"no lease, old node", withBirth(node("n", "True", ""), old), nil, true, true},
		{"no lease, just registered", withBirth(node("n", "", ""), young), nil, false, false},
		{"lease never renewed, old", withBirth(node("n", "True", ""), old), &kube.Lease{}, true, true},
		{"short lease renewed", withBirth(node("n", "True", ""), old), lease(now.Add(-2*time.Second), 3), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost, mark := lossDecision(tc.n, tc.l, leaseGrace, now)
			if lost != tc.lost || mark != tc.mark {
				t.Fatalf("lossDecision = lost %v mark %v, want %v %v", lost, mark, tc.lost, tc.mark)
			}
		})
	}
}

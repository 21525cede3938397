package api

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/sandbox"
)

// usageNode answers /v1/usage with rep and /v1/reports/orphans with orph,
// as a node does; a since it cannot read is refused, naming the field.
func usageNode(rep wire.UsageReport, orph wire.OrphanReport) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("since") == "bad" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"code":400,"message":"since: must be an RFC 3339 time","reason":"invalid_argument"}`)
			return
		}
		switch r.URL.Path {
		case "/v1/usage":
			_ = json.NewEncoder(w).Encode(rep)
		case "/v1/reports/orphans":
			_ = json.NewEncoder(w).Encode(orph)
		default:
			http.NotFound(w, r)
		}
	}
}

// Usage and the orphan report are asked of every alive node, signed as
// the caller, and merged; the nodes that are not in the answer (lease
// run out, too slow, failing, too large an answer) are named in
// Berth-Unanswered-Nodes.
func TestFanOutUsageAndOrphans(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	_, url := c.replica(func(cfg *Config) { cfg.FanOutTimeout = 300 * time.Millisecond })
	since := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	active := since.Add(time.Hour)
	prices := wire.Prices{Currency: "USD", VCPUHour: 0.05}
	tmplOrphan := wire.Orphan{Kind: "template", ID: "old", State: "ready", IdleDays: 30}
	n1 := c.node("n1", 16384, usageNode(wire.UsageReport{Since: since, Prices: prices,
		Owners:    []wire.UsageLine{{Owner: "alice", Sandboxes: 1, CPUSeconds: 10, MemGiBSeconds: 100, RunningSeconds: 100, MemPeakMiB: 512, CostActive: 1}},
		Sandboxes: []wire.UsageLine{{SandboxID: "s1", Owner: "alice", CPUSeconds: 10, MemGiBSeconds: 100, RunningSeconds: 100, MemPeakMiB: 512, CostActive: 1}}},
		wire.OrphanReport{Days: 7, Items: []wire.Orphan{tmplOrphan, {Kind: "sandbox", ID: "s1", Owner: "alice", IdleDays: 8}}}))
	c.node("n2", 16384, usageNode(wire.UsageReport{Since: since, Prices: prices,
		Owners: []wire.UsageLine{
			{Owner: "alice", Sandboxes: 1, CPUSeconds: 5, MemGiBSeconds: 50, RunningSeconds: 50, FrozenSeconds: 50, MemPeakMiB: 1024, CostActive: 2, LastActiveAt: active},
			{Owner: "bob", Sandboxes: 1, CPUSeconds: 1, RunningSeconds: 10}},
		Sandboxes: []wire.UsageLine{
			{SandboxID: "s2", Owner: "alice", CPUSeconds: 5, MemGiBSeconds: 50, RunningSeconds: 50, FrozenSeconds: 50, MemPeakMiB: 1024, CostActive: 2, LastActiveAt: active},
			{SandboxID: "s3", Owner: "bob", CPUSeconds: 1, RunningSeconds: 10}}},
		wire.OrphanReport{Days: 7, Items: []wire.Orphan{tmplOrphan, {Kind: "snapshot", ID: "snap1", Owner: "bob", IdleDays: 9}}}))
	// Too slow: past the per-node timeout.
	c.node("n3", 16384, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	// Its lease ran out: not asked at all.
	silent := c.node("n4", 16384, usageNode(wire.UsageReport{Owners: []wire.UsageLine{{Owner: "mallory", CPUSeconds: 1e9}}}, wire.OrphanReport{}))
	c.renew("n4", time.Now().Add(-time.Minute), 40)
	// Failing, and answering more than its share of the byte budget.
	c.node("n5", 16384, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "disk on fire", 500) })
	c.node("n6", 16384, func(w http.ResponseWriter, r *http.Request) {
		chunk := strings.Repeat(" ", 1<<20)
		for range 8 {
			_, _ = io.WriteString(w, chunk)
		}
	})

	st, hdr, body := c.do("GET", url+"/v1/usage?since=2026-12-01T00:00:00Z", c.admin, "")
	if st != 200 {
		t.Fatalf("usage: %d %s", st, body)
	}
	if got := hdr.Get(HeaderUnanswered); got != "n3,n4,n5,n6" {
		t.Errorf("%s = %q, want n3,n4,n5,n6", HeaderUnanswered, got)
	}
	var rep wire.UsageReport
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	want := wire.UsageReport{Since: since, Prices: prices,
		Owners: []wire.UsageLine{
			{Owner: "alice", Sandboxes: 2, CPUSeconds: 15, MemGiBSeconds: 150, RunningSeconds: 150, FrozenSeconds: 50,
				MemPeakMiB: 1024, MemAvgMiB: 150.0 / 200 * 1024, CostActive: 3, LastActiveAt: active},
			{Owner: "bob", Sandboxes: 1, CPUSeconds: 1, RunningSeconds: 10}},
		Sandboxes: []wire.UsageLine{
			{SandboxID: "s1", Owner: "alice", CPUSeconds: 10, MemGiBSeconds: 100, RunningSeconds: 100, MemPeakMiB: 512, CostActive: 1},
			{SandboxID: "s2", Owner: "alice", CPUSeconds: 5, MemGiBSeconds: 50, RunningSeconds: 50, FrozenSeconds: 50, MemPeakMiB: 1024, CostActive: 2, LastActiveAt: active},
			{SandboxID: "s3", Owner: "bob", CPUSeconds: 1, RunningSeconds: 10}}}
	if d := cmp.Diff(want, rep); d != "" {
		t.Errorf("merged usage (-want +got):\n%s", d)
	}
	if len(silent.requests()) != 0 {
		t.Errorf("the node whose lease ran out was asked %d times", len(silent.requests()))
	}
	// Asked as the caller, with its query, never with its key.
	r1 := n1.requests()
	if len(r1) != 1 || !r1[0].signed || r1[0].principal != (peer.Principal{Owner: "admin", Admin: true}) ||
		r1[0].header.Get("X-Api-Key") != "" || r1[0].path != "/v1/usage" {
		t.Fatalf("n1 saw %+v", r1)
	}

	// A tenant is asked for as itself (the node scopes the answer).
	if st, _, body := c.do("GET", url+"/v1/usage", c.key, ""); st != 200 {
		t.Fatalf("alice's usage: %d %s", st, body)
	}
	if r1 = n1.requests(); r1[len(r1)-1].principal != (peer.Principal{Owner: "alice"}) {
		t.Fatalf("alice's usage asked as %+v", r1[len(r1)-1].principal)
	}

	// A request the nodes refuse is refused as they say.
	if st, _, body := c.do("GET", url+"/v1/usage?since=bad", c.admin, ""); st != 400 || !strings.Contains(body, "since") {
		t.Fatalf("bad since: %d %s", st, body)
	}

	st, hdr, body = c.do("GET", url+"/v1/reports/orphans?days=7", c.admin, "")
	var orph wire.OrphanReport
	if err := json.Unmarshal([]byte(body), &orph); st != 200 || err != nil {
		t.Fatalf("orphans: %d %s", st, body)
	}
	wantO := wire.OrphanReport{Days: 7, Items: []wire.Orphan{tmplOrphan,
		{Kind: "snapshot", ID: "snap1", Owner: "bob", IdleDays: 9}, {Kind: "sandbox", ID: "s1", Owner: "alice", IdleDays: 8}}}
	if d := cmp.Diff(wantO, orph); d != "" || hdr.Get(HeaderUnanswered) == "" {
		t.Errorf("merged orphans (-want +got):\n%s\nunanswered %q", d, hdr.Get(HeaderUnanswered))
	}
}

// With no node answering, the answer is 503 naming the nodes asked, not
// an empty report that looks like no usage.
func TestFanOutNoNodeAnswers(t *testing.T) {
	c := newCluster(t)
	c.node("only", 16384, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) })
	if st, _, body := c.do("GET", c.url+"/v1/usage", c.admin, ""); st != 503 || !strings.Contains(body, "only") {
		t.Fatalf("usage with its only node failing: %d %s", st, body)
	}
}

// Quotas are the store's (set through one replica, read through
// another); their use is the Sandbox objects' and the snapshots the
// nodes hold.
func TestQuotas(t *testing.T) {
	c := newCluster(t)
	snapNode := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/snapshots" {
			p, _, _ := peer.Verify(r, c.token)
			list := []wire.Snapshot{{ID: "sn1", Owner: "alice"}, {ID: "sn2", Owner: "bob"}}
			if !p.Admin {
				list = list[:1] // a node scopes a tenant's list
			}
			_ = json.NewEncoder(w).Encode(list)
			return
		}
		createdHandler(w, r)
	}
	c.node("n1", 65536, snapNode)
	c.node("n2", 65536, snapNode)
	c.create(`{"memory_mib":1024,"cpu":2}`)
	c.create(`{"memory_mib":2048,"cpu":1}`)

	if st, _, body := c.do("PUT", c.url+"/v1/quotas/alice", c.key, `{"sandboxes":3}`); st != 403 {
		t.Fatalf("a tenant setting its quota: %d %s", st, body)
	}
	if st, _, body := c.do("PUT", c.url+"/v1/quotas/alice", c.admin, `{"sandboxes":-1}`); st != 400 || !strings.Contains(body, "sandboxes") {
		t.Fatalf("a negative limit: %d %s", st, body)
	}
	if st, _, body := c.do("PUT", c.url+"/v1/quotas/alice", c.admin, `{"sandboxes":3,"memory_mib":8192}`); st != 200 {
		t.Fatalf("set alice's quota: %d %s", st, body)
	}
	_, url2 := c.replica()
	st, hdr, body := c.do("GET", url2+"/v1/quotas/alice", c.key, "")
	var qi wire.QuotaInfo
	if err := json.Unmarshal([]byte(body), &qi); st != 200 || err != nil {
		t.Fatalf("alice's quota on another replica: %d %s", st, body)
	}
	want := wire.QuotaInfo{Owner: "alice", Source: "stored", Limits: wire.QuotaLimits{Sandboxes: 3, MemoryMiB: 8192},
		Use: wire.QuotaUse{Sandboxes: 2, CPU: 3, MemoryMiB: 3072, DiskMiB: qi.Use.DiskMiB, Snapshots: 2}}
	if d := cmp.Diff(want, qi); d != "" || hdr.Get(HeaderUnanswered) != "" {
		t.Errorf("alice's quota (-want +got):\n%s\nunanswered %q", d, hdr.Get(HeaderUnanswered))
	}
	if st, _, _ := c.do("GET", c.url+"/v1/quotas/bob", c.key, ""); st != 403 {
		t.Fatalf("alice reads bob's quota: %d", st)
	}
	_, _, body = c.do("GET", c.url+"/v1/quotas", c.admin, "")
	var list []wire.QuotaInfo
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].Owner != "alice" || list[0].Use.Snapshots != 2 {
		t.Fatalf("admin's quota list: %s", body)
	}
	// Creates are held to the stored limits over the whole cluster.
	c.create(`{"memory_mib":1024}`)
	if st, _, body := c.do("POST", url2+"/v1/sandboxes", c.key, `{"memory_mib":512}`); st != 429 || !strings.Contains(body, "sandboxes") {
		t.Fatalf("a fourth sandbox past a limit of 3: %d %s", st, body)
	}
	if st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.bob, `{"memory_mib":512}`); st != 201 {
		t.Fatalf("bob, without a quota: %d %s", st, body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/quotas/alice", c.admin, ""); st != 204 {
		t.Fatalf("delete alice's quota: %d %s", st, body)
	}
	if _, _, body := c.do("GET", c.url+"/v1/quotas/alice", c.admin, ""); !strings.Contains(body, `"source": "none"`) {
		t.Fatalf("alice's quota after delete: %s", body)
	}
}

// The audit chains of the nodes are merged by time; one node's chain is
// paged and verified on that node.
func TestAuditMerged(t *testing.T) {
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	chain := func(offsets ...int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/audit":
				l := wire.AuditList{Entries: []wire.AuditEntry{}}
				for i, o := range offsets {
					l.Entries = append(l.Entries, wire.AuditEntry{Seq: int64(i + 1), Time: t0.Add(time.Duration(o) * time.Minute), Action: "api"})
				}
				if r.URL.Query().Get("after") != "" {
					l.Entries = l.Entries[1:]
				}
				_ = json.NewEncoder(w).Encode(l)
			case "/v1/audit/verify":
				_ = json.NewEncoder(w).Encode(wire.AuditReport{OK: true, Entries: int64(len(offsets))})
			}
		}
	}
	c.node("n1", 16384, chain(0, 2, 4))
	n2 := c.node("n2", 16384, chain(1, 3))
	_, _, body := c.do("GET", c.url+"/v1/audit?limit=4", c.admin, "")
	var l wire.AuditList
	if err := json.Unmarshal([]byte(body), &l); err != nil || len(l.Entries) != 4 || l.Next != 0 {
		t.Fatalf("merged audit: %s", body)
	}
	for i, e := range l.Entries {
		if !e.Time.Equal(t0.Add(time.Duration(i) * time.Minute)) {
			t.Fatalf("merged audit entry %d at %s, want minute %d: %s", i, e.Time, i, body)
		}
	}
	if st, _, body := c.do("GET", c.url+"/v1/audit?after=3", c.admin, ""); st != 400 || !strings.Contains(body, "node") {
		t.Fatalf("after= without a node: %d %s", st, body)
	}
	st, hdr, body := c.do("GET", c.url+"/v1/audit?node=n2&after=1", c.admin, "")
	if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil || hdr.Get(HeaderNode) != "n2" || len(l.Entries) != 1 {
		t.Fatalf("n2's chain after 1: %d %s", st, body)
	}
	if st, _, body := c.do("POST", c.url+"/v1/audit/verify", c.admin, ""); st != 400 || !strings.Contains(body, "node") {
		t.Fatalf("verify without a node: %d %s", st, body)
	}
	if st, _, _ := c.do("POST", c.url+"/v1/audit/verify?node=n2", c.key, ""); st != 403 {
		t.Fatalf("a tenant verifying: %d", st)
	}
	if st, _, body := c.do("POST", c.url+"/v1/audit/verify?node=n2", c.admin, ""); st != 200 || !strings.Contains(body, `"entries":2`) {
		t.Fatalf("verify n2: %d %s", st, body)
	}
	if last := n2.requests()[len(n2.requests())-1]; last.path != "/v1/audit/verify" || last.principal != (peer.Principal{Owner: "admin", Admin: true}) {
		t.Fatalf("n2's last request: %+v", last)
	}
}

// The cost series of the nodes add up per key and bucket, buckets
// matched by time.
func TestMergeSeries(t *testing.T) {
	h := func(i int) time.Time { return time.Date(2026, 12, 1, i, 0, 0, 0, time.UTC) }
	a := wire.UsageSeries{By: "owner", StepSeconds: 3600, Buckets: []time.Time{h(1), h(2)}, Lines: []wire.SeriesLine{
		{Key: "alice", Reserved: []float64{1, 2}, Active: []float64{0.5, 1}, TotalReserved: 3, TotalActive: 1.5}}}
	// Computed an hour later: its window starts at 2 and has a bucket at 3.
	b := wire.UsageSeries{By: "owner", StepSeconds: 3600, Buckets: []time.Time{h(2), h(3)}, Lines: []wire.SeriesLine{
		{Key: "alice", Reserved: []float64{10, 99}, Active: []float64{1, 99}, TotalReserved: 109, TotalActive: 100},
		{Key: "bob", Reserved: []float64{4, 0}, Active: []float64{2, 0}, TotalReserved: 4, TotalActive: 2}}}
	got := mergeSeries([]wire.UsageSeries{a, b})
	want := wire.UsageSeries{By: "owner", StepSeconds: 3600, Buckets: []time.Time{h(1), h(2)}, Lines: []wire.SeriesLine{
		{Key: "alice", Reserved: []float64{1, 12}, Active: []float64{0.5, 2}, TotalReserved: 13, TotalActive: 2.5},
		{Key: "bob", Reserved: []float64{0, 4}, Active: []float64{0, 2}, TotalReserved: 4, TotalActive: 2}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("merged series (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wire.UsageSeries{Buckets: []time.Time{}, Lines: []wire.SeriesLine{}}, mergeSeries(nil)); d != "" {
		t.Errorf("no parts: %s", d)
	}
}

// An orphan clean-up goes to every node; each item is judged by the node
// that holds it.
func TestOrphanCleanup(t *testing.T) {
	c := newCluster(t)
	nf := func(kind, id string) wire.OrphanRefusal {
		return wire.OrphanRefusal{Kind: kind, ID: id, Error: wire.Error{Code: 404, Message: kind + " not found", Reason: "not_found"}}
	}
	c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(wire.OrphanCleanupResult{Deleted: []wire.OrphanRef{{Kind: "sandbox", ID: "sa"}},
			Refused: []wire.OrphanRefusal{nf("snapshot", "sn1"), nf("snapshot", "zz")}})
	})
	n2 := c.node("n2", 16384, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(wire.OrphanCleanupResult{Deleted: []wire.OrphanRef{}, Refused: []wire.OrphanRefusal{nf("sandbox", "sa"),
			{Kind: "snapshot", ID: "sn1", Error: wire.Error{Code: 409, Message: "snapshot sn1 is not an orphan", Reason: "failed_precondition"}},
			nf("snapshot", "zz")}})
	})
	req := `{"days":7,"sandboxes":["sa"],"snapshots":["sn1","zz"]}`
	st, _, body := c.do("POST", c.url+"/v1/reports/orphans/cleanup", c.key, req)
	var res wire.OrphanCleanupResult
	if err := json.Unmarshal([]byte(body), &res); st != 200 || err != nil {
		t.Fatalf("clean-up: %d %s", st, body)
	}
	if len(res.Deleted) != 1 || res.Deleted[0].ID != "sa" || len(res.Refused) != 2 ||
		res.Refused[0].Error.Reason != "failed_precondition" || res.Refused[1].Error.Reason != "not_found" {
		t.Fatalf("clean-up result: %s", body)
	}
	if rq := n2.requests(); len(rq) != 1 || rq[0].body != req || rq[0].principal.Owner != "alice" {
		t.Fatalf("n2 saw %+v", rq)
	}
	c.renew("n2", time.Now().Add(-time.Minute), 40)
	_, hdr, body := c.do("POST", c.url+"/v1/reports/orphans/cleanup", c.key, req)
	if err := json.Unmarshal([]byte(body), &res); err != nil || hdr.Get(HeaderUnanswered) != "n2" || len(res.Refused) != 2 ||
		res.Refused[0].Error.Reason != "unavailable" || !strings.Contains(res.Refused[0].Error.Message, "n2") {
		t.Fatalf("clean-up with n2 silent: %s", body)
	}
	if st, _, body := c.do("POST", c.url+"/v1/reports/orphans/cleanup", c.key, `{"sandboxes":`); st != 400 || !strings.Contains(body, "body") {
		t.Fatalf("a broken body: %d %s", st, body)
	}
}

// The global event feed is the nodes' and the store's, merged by time.
func TestEventsMerged(t *testing.T) {
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	n1 := c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode([]wire.Event{{Seq: 1, SandboxID: "sa", Owner: "alice", Time: t0, Type: "transition"},
			{Seq: 2, SandboxID: "sa", Owner: "alice", Time: t0.Add(2 * time.Minute), Type: "transition"}})
	})
	if _, err := c.st.AppendEvent(t.Context(), sandbox.Event{SandboxID: "sb", Owner: "alice", Time: t0.Add(time.Minute), Type: "transition",
		To: sandbox.Lost, Reason: ReasonNodeLost}); err != nil {
		t.Fatal(err)
	}
	_, _, body := c.do("GET", c.url+"/v1/events", c.key, "")
	var evs []wire.Event
	if err := json.Unmarshal([]byte(body), &evs); err != nil || len(evs) != 3 || evs[1].Reason != ReasonNodeLost || evs[2].Seq != 2 {
		t.Fatalf("merged events: %s", body)
	}
	if _, _, body := c.do("GET", c.url+"/v1/events?limit=2", c.key, ""); strings.Count(body, `"seq"`) != 2 {
		t.Fatalf("limit 2: %s", body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/events?after=1", c.key, ""); st != 400 || !strings.Contains(body, "node") {
		t.Fatalf("after without a node: %d %s", st, body)
	}
	if st, hdr, _ := c.do("GET", c.url+"/v1/events?node=n1&after=1", c.key, ""); st != 200 || hdr.Get(HeaderNode) != "n1" {
		t.Fatalf("n1's feed: %d", st)
	}
	if last := n1.requests()[len(n1.requests())-1]; last.principal.Owner != "alice" || last.path != "/v1/events" {
		t.Fatalf("n1 asked as %+v", last.principal)
	}
}

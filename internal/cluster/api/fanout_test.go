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
	if st, _, body := c.do("DELETE", c.url+"/v1/quotas/alice", c.admin, ""); st != 204 {
		t.Fatalf("delete alice's quota: %d %s", st, body)
	}
	if _, _, body := c.do("GET", c.url+"/v1/quotas/alice", c.admin, ""); !strings.Contains(body, `"source": "none"`) {
		t.Fatalf("alice's quota after delete: %s", body)
	}
}

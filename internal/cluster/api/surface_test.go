package api

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

func (c *cluster) warmPool(template string) (berthv1.WarmPool, error) {
	var l berthv1.WarmPoolList
	if err := srv.Client.List(c.t.Context(), berthv1.WarmPools, c.ns, kube.ListOptions{}, &l); err != nil {
		return berthv1.WarmPool{}, err
	}
	for _, wp := range l.Items {
		if wp.Spec.Template == template {
			return wp, nil
		}
	}
	return berthv1.WarmPool{}, errs.E(errs.NotFound, "no WarmPool of %s", template)
}

// Pools through a replica: PUT writes the template's WarmPool (validated
// as one host validates), GET reads it back from any replica with the
// ready members of the alive nodes summed, DELETE removes it; all admin
// only. A template with a pool is not removed.
func TestPools(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	ctx := t.Context()
	var nodes []*fakeNode
	for _, n := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, c.node(n, 16384, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }))
	}
	c.renew("n3", time.Now().Add(-time.Minute), 40) // n3's agent is gone
	// Each collection's storage initializes on its own: wait for WarmPools'.
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		_, err := c.warmPool("default")
		if errs.Is(err, errs.NotFound) {
			return nil
		}
		return err
	})

	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/pools", ""}, {"PUT", "/v1/pools/default", `{"size":1}`}, {"DELETE", "/v1/pools/default", ""},
	} {
		if st, _, body := c.do(tc.method, c.url+tc.path, c.key, tc.body); st != 403 || !strings.Contains(body, "admin") {
			t.Errorf("a tenant's %s %s: %d %s", tc.method, tc.path, st, body)
		}
	}
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/pools/default", `{}`, "size"},
		{"/v1/pools/default", `{"size":101}`, "size"},
		{"/v1/pools/default", `{"size":0}`, "size"},
		{"/v1/pools/default", `{"size":1,"cpu":-1}`, "cpu"},
		{"/v1/pools/default", `{"size":1,"cpu":9}`, "cpu"},               // past every node's 8 CPUs
		{"/v1/pools/default", `{"size":1,"cpu":1e300}`, "cpu"},           // no overflow into a small figure
		{"/v1/pools/default", `{"size":1,"memory_mib":20000}`, "memory"}, // past every node's 16 GiB
		{"/v1/pools/default", `{"size":1,"pids":2}`, "pids"},
		{"/v1/pools/default", `{"size":1,"min":1,"max":2}`, "min"},
		{"/v1/pools/default", `{"size":1,"auto":true,"min":3,"max":2}`, "max"},
		{"/v1/pools/default", `{"size":1,"runtime":"runsc"}`, "runtime"},
		{"/v1/pools/default", `{"size":1,"bogus":1}`, "bogus"},
		{"/v1/pools/Bad!", `{"size":1}`, "template"},
	} {
		st, _, body := c.do("PUT", c.url+tc.path, c.admin, tc.body)
		if st != 400 || !strings.Contains(body, tc.field) {
			t.Errorf("PUT %s %s: %d %s (want 400 naming %s)", tc.path, tc.body, st, body, tc.field)
		}
	}
	if _, err := c.warmPool("default"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("a refused PUT wrote a WarmPool: %v", err)
	}

	st, _, body := c.do("PUT", c.url+"/v1/pools/default", c.admin, `{"size":2,"cpu":0.5,"memory_mib":256,"runtime":"runc"}`)
	var ps wire.PoolStatus
	if err := json.Unmarshal([]byte(body), &ps); st != 200 || err != nil {
		t.Fatalf("set a fixed pool: %d %s", st, body)
	}
	want := wire.PoolStatus{Template: "default", Size: 2, Runtime: "runc", Resources: wire.Resources{CPUMillis: 500, MemoryMiB: 256},
		Target: 4, State: "filling"} // two alive nodes keep two each
	if d := cmp.Diff(want, ps); d != "" {
		t.Fatalf("set pool (-want +got):\n%s", d)
	}
	wp, err := c.warmPool("default")
	if err != nil || wp.Spec.Min != 2 || wp.Spec.Max != 2 || wp.Spec.Resources.CPUMillis != 500 || wp.Name != "default" {
		t.Fatalf("the WarmPool: %+v %v", wp, err)
	}
	// The nodes report their ready members (as the node agent does); the
	// dead node's report is not counted.
	wp.Status = berthv1.WarmPoolStatus{Ready: 8, PerNode: map[string]int32{"n1": 2, "n2": 1, "n3": 5}}
	if err := srv.Client.Update(ctx, berthv1.WarmPools, c.ns, wp.Name, &wp, nil); err != nil {
		t.Fatal(err)
	}
	_, url2 := c.replica()
	_, _, body = c.do("GET", url2+"/v1/pools", c.admin, "")
	var list []wire.PoolStatus
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].Ready != 3 || list[0].Target != 4 ||
		list[0].Size != 2 || list[0].Auto {
		t.Fatalf("pools through another replica: %s", body)
	}

	// Auto sizing: min and max kept, the nodes' reports too.
	st, _, body = c.do("PUT", c.url+"/v1/pools/default", c.admin, `{"size":1,"auto":true,"min":1,"max":6}`)
	if err := json.Unmarshal([]byte(body), &ps); st != 200 || err != nil || !ps.Auto || ps.Min != 1 || ps.Max != 6 || ps.Ready != 3 || ps.Target != 2 || ps.State != "ready" {
		t.Fatalf("set an auto pool: %d %s", st, body)
	}
	if wp, err = c.warmPool("default"); err != nil || wp.Spec.Min != 1 || wp.Spec.Max != 6 || wp.Status.PerNode["n1"] != 2 {
		t.Fatalf("the WarmPool after the second PUT: %+v %v", wp, err)
	}
	// Auto without max: four times the size, as on one host.
	if st, _, body := c.do("PUT", c.url+"/v1/pools/py_3", c.admin, `{"size":2,"auto":true}`); st != 200 || !strings.Contains(body, `"max": 8`) {
		t.Fatalf("auto pool with the default max: %d %s", st, body)
	}
	if wp, err := c.warmPool("py_3"); err != nil || !strings.HasPrefix(wp.Name, "p.") {
		t.Fatalf("a template name that is no object name: %+v %v", wp, err)
	}

	// The template of a pool stays; no node is asked.
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/default", c.admin, ""); st != 409 || !strings.Contains(body, "pool rm") {
		t.Fatalf("remove a pooled template: %d %s", st, body)
	}
	for _, n := range nodes {
		if rs := n.requests(); len(rs) != 0 {
			t.Fatalf("node %s was asked: %+v", n.name, rs)
		}
	}

	if st, _, body := c.do("DELETE", c.url+"/v1/pools/default", c.admin, ""); st != 204 {
		t.Fatalf("delete the pool: %d %s", st, body)
	}
	if _, err := c.warmPool("default"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("the WarmPool after its delete: %v", err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/pools/default", c.admin, ""); st != 404 || !strings.Contains(body, "no pool") {
		t.Fatalf("delete it again: %d %s", st, body)
	}
	_, _, body = c.do("GET", c.url+"/v1/pools", c.admin, "")
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 || list[0].Template != "py_3" {
		t.Fatalf("pools after the delete: %s", body)
	}
}

// leaseNode answers the lease routes as a node does for the leases it
// holds: scoped to the signed principal's owner (the admin's ?owner=, or
// all), a revoke of one it does not hold (or the caller may not see) 404.
func leaseNode(token string, held []wire.Lease, owners map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, _, _ := peer.Verify(r, token)
		scope := p.Owner
		if p.Admin {
			scope = r.URL.Query().Get("owner")
		}
		visible := func(l wire.Lease) bool { return scope == "" || owners[l.SandboxID] == scope }
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/leases":
			out := wire.LeaseList{Leases: []wire.Lease{}}
			for _, l := range held {
				if visible(l) {
					out.Leases = append(out.Leases, l)
				}
			}
			_ = json.NewEncoder(w).Encode(out)
			return
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/v1/leases/"):
			for _, l := range held {
				if "/v1/leases/"+l.ID == r.URL.Path && visible(l) {
					l.State, l.Reason = "revoked", "revoked"
					_ = json.NewEncoder(w).Encode(l)
					return
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"code":404,"message":"lease not found","reason":"not_found"}`)
	}
}

// Leases are asked of every node as the caller and merged; a revoke
// reaches the node holding the lease; a silent node is named.
func TestLeases(t *testing.T) {
	noLeaks(t)
	bin := testutil.BuildBinaries(t) // first: the nodes' 40 s Leases must not run out during the build
	c := newCluster(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	owners := map[string]string{"sba": "alice", "sbb": "bob", "sbc": "alice"}
	la := wire.Lease{ID: "la1", SandboxID: "sba", Generation: 1, Secret: "GH", Host: "api.github.com", State: "active", IssuedAt: t0}
	lb := wire.Lease{ID: "lb1", SandboxID: "sbb", Generation: 1, Secret: "GH", Host: "api.github.com", State: "active", IssuedAt: t0}
	lc := wire.Lease{ID: "lc2", SandboxID: "sbc", Generation: 2, Secret: "NPM", Host: "registry.npmjs.org", State: "frozen", IssuedAt: t0}
	c.node("n1", 16384, leaseNode(c.token, []wire.Lease{lc, lb}, owners))
	n2 := c.node("n2", 16384, leaseNode(c.token, []wire.Lease{la}, owners))
	c.node("n3", 16384, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "disk on fire", 500) })

	leases := func(key, query string) ([]string, string) {
		t.Helper()
		st, hdr, body := c.do("GET", c.url+"/v1/leases"+query, key, "")
		var l wire.LeaseList
		if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil {
			t.Fatalf("GET /v1/leases%s: %d %s", query, st, body)
		}
		var ids []string
		for _, x := range l.Leases {
			ids = append(ids, x.ID)
		}
		return ids, hdr.Get(HeaderUnanswered)
	}
	if ids, un := leases(c.key, ""); !cmp.Equal(ids, []string{"la1", "lc2"}) || un != "n3" {
		t.Fatalf("alice's leases: %v unanswered %q", ids, un)
	}
	if ids, _ := leases(c.key, "?owner=bob"); !cmp.Equal(ids, []string{"la1", "lc2"}) {
		t.Fatalf("alice asking for bob's: %v (a tenant's ?owner= is not hers to choose)", ids)
	}
	if ids, _ := leases(c.bob, ""); !cmp.Equal(ids, []string{"lb1"}) {
		t.Fatalf("bob's leases: %v", ids)
	}
	if ids, _ := leases(c.admin, ""); !cmp.Equal(ids, []string{"la1", "lb1", "lc2"}) {
		t.Fatalf("every lease: %v", ids)
	}
	if ids, _ := leases(c.admin, "?owner=bob"); !cmp.Equal(ids, []string{"lb1"}) {
		t.Fatalf("the admin asking for bob's: %v", ids)
	}

	// n3 fails: a lease on none of the others may be on it.
	if st, hdr, body := c.do("DELETE", c.url+"/v1/leases/la1", c.bob, ""); st != 503 || hdr.Get(HeaderUnanswered) != "n3" || !strings.Contains(body, "n3") {
		t.Fatalf("bob revoking alice's lease with n3 failing: %d %q %s", st, hdr.Get(HeaderUnanswered), body)
	}
	st, hdr, body := c.do("DELETE", c.url+"/v1/leases/la1", c.key, "")
	var l wire.Lease
	if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil || l.ID != "la1" || l.State != "revoked" || hdr.Get(HeaderNode) != "n2" {
		t.Fatalf("alice revoking her lease: %d %q %s", st, hdr.Get(HeaderNode), body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/leases/l%20x", c.key, ""); st != 404 {
		t.Fatalf("a lease id that is no id: %d %s", st, body)
	}

	// Naming the lease's sandbox sends the revoke to its node alone,
	// n3's failure notwithstanding; another owner's sandbox is not found.
	sbc := &sandbox.Sandbox{ID: "sbc", Owner: "alice", Template: "default", State: sandbox.Running,
		CreatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}
	sbc.Attrs.Cluster.Node = "n1"
	if err := c.st.CreateSandbox(t.Context(), sbc); err != nil {
		t.Fatal(err)
	}
	before := len(n2.requests())
	st, hdr, body = c.do("DELETE", c.url+"/v1/leases/lc2?sandbox=sbc", c.key, "")
	if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil || l.ID != "lc2" || hdr.Get(HeaderNode) != "n1" || len(n2.requests()) != before {
		t.Fatalf("alice revoking by sandbox: %d %q %s", st, hdr.Get(HeaderNode), body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/leases/lc2?sandbox=sbc", c.bob, ""); st != 404 || !strings.Contains(body, "sbc") {
		t.Fatalf("bob revoking by alice's sandbox: %d %s", st, body)
	}

	// With n3 gone from the fleet, every node answers: a lease none holds
	// (or the caller may not see) is 404.
	if err := srv.Client.Delete(t.Context(), berthv1.Nodes, c.ns, "n3", kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/leases/la1", c.bob, ""); st != 404 {
		t.Fatalf("bob revoking alice's lease: %d %s", st, body)
	}

	// The CLI against the replica reads and revokes the same way.
	berth := func(key string, args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "berth"), args...)
		cmd.Env = append(os.Environ(), "BERTH_URL="+c.url, "BERTH_API_KEY="+key)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := berth(c.key, "secret", "leases", "--json")
	var got []wire.Lease
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || len(got) != 2 || got[0].ID != "la1" {
		t.Fatalf("berth secret leases: %v: %s", err, out)
	}
	if out, err := berth(c.key, "secret", "revoke", "lc2"); err != nil || !strings.Contains(out, "lc2 revoked") {
		t.Fatalf("berth secret revoke: %v: %s", err, out)
	}
	if out, err := berth(c.bob, "secret", "revoke", "lc2"); err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("bob: berth secret revoke of alice's lease: %v: %s", err, out)
	}
}

// /metrics on a replica is the admin's, and counts the replica's own
// work: requests by route, forwards by node, placements, node losses.
func TestReplicaMetrics(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	c.node("m1", 16384, createdHandler)
	c.create(`{}`)
	if st, _, _ := c.do("GET", c.url+"/v1/nosuch", c.key, ""); st != 501 {
		t.Fatalf("an unserved /v1 path: %d", st)
	}
	if st, _, body := c.do("GET", c.url+"/metrics", c.key, ""); st != 403 {
		t.Fatalf("a tenant's /metrics: %d %s", st, body)
	}
	c.renew("m1", time.Now().Add(-time.Minute), 40)
	if err := c.rep.DetectLoss(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{}`); st != 429 && st != 503 {
		t.Fatalf("a create with no node alive: %d %s", st, body)
	}
	st, hdr, body := c.do("GET", c.url+"/metrics", c.admin, "")
	if st != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("/metrics: %d %q %s", st, hdr.Get("Content-Type"), body)
	}
	for _, line := range []string{
		`berth_replica_requests_total{route="POST /v1/sandboxes",code="201"} 1`,
		`berth_replica_requests_total{route="GET /metrics",code="403"} 1`,
		`berth_replica_requests_total{route="/v1/",code="501"} 1`,
		`berth_replica_forward_seconds_count{node="m1"} 1`,
		`berth_replica_placements_total{node="m1",class="short",template="cold"} 1`,
		`berth_replica_node_loss_marks_total{kind="node",node="m1"} 1`,
		`berth_replica_node_loss_marks_total{kind="sandbox",node="m1"} 1`,
		"# TYPE berth_replica_forward_seconds histogram",
		"# TYPE berth_replica_placement_failures_total counter",
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, body)
		}
	}
	if !strings.Contains(body, "berth_replica_placement_failures_total{kind=") {
		t.Errorf("/metrics counts no placement failure:\n%s", body)
	}
}

// E2B's template build API is not berth's on one host: a replica answers
// it as one host does (501, E2B's error form), and E2B's DELETE
// /templates/{id} still reaches the snapshots.
func TestE2BTemplateBuilds(t *testing.T) {
	c := newCluster(t)
	c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v3/templates"}, {"POST", "/v2/templates/tpl1/builds/b1"}, {"GET", "/templates/tpl1/builds/b1/status"},
		{"GET", "/templates"}, {"POST", "/templates"},
	} {
		st, _, body := c.do(tc.method, c.url+tc.path, c.key, `{}`, "Content-Type", "application/json")
		if st != 501 || !strings.Contains(body, "not implemented by berth") || !strings.Contains(body, `"code":501`) {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, st, body)
		}
	}
	if st, _, body := c.do("POST", c.url+"/v3/templates", "", `{}`); st != 401 {
		t.Errorf("a build without a key: %d %s", st, body)
	}
	if st, _, body := c.do("DELETE", c.url+"/templates/snap1", c.key, ""); st != 404 {
		t.Errorf("E2B delete of an unknown snapshot: %d %s", st, body)
	}
}

// A template a Sandbox object uses (bound, not yet made on its node, so
// no node would refuse) is not removed, and no node is asked; a lost
// sandbox's does not hold it.
func TestTemplateDeleteInUse(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	ctx := t.Context()
	if _, err := c.st.PutTemplate(ctx, store.Template{Name: "py", Fingerprint: "fp-py", State: store.TemplateReady}); err != nil {
		t.Fatal(err)
	}
	n1 := c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(wire.TemplateDeleted{Removed: "py"})
	})
	sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: "alice", Template: "py", TemplateID: "fp-py", State: sandbox.Creating,
		CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Hour).UTC()}
	sb.Attrs.Cluster.Node = "n1"
	if err := c.st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/py", c.admin, ""); st != 409 || !strings.Contains(body, sb.ID) {
		t.Fatalf("remove a template a bound sandbox uses: %d %s", st, body)
	}
	if rs := n1.requests(); len(rs) != 0 {
		t.Fatalf("n1 was asked: %+v", rs)
	}
	if _, err := c.st.Transition(ctx, sb.ID, sandbox.Lost, sandbox.Event{Actor: "scheduler", Reason: ReasonNodeLost, Time: time.Now().UTC()}, nil); err != nil {
		t.Fatal(err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/py", c.admin, ""); st != 200 {
		t.Fatalf("remove it once the sandbox is lost: %d %s", st, body)
	}
	if rs := n1.requests(); len(rs) != 1 || rs[0].method != "DELETE" || rs[0].path != "/v1/templates/py" {
		t.Fatalf("n1 saw %+v", rs)
	}
}

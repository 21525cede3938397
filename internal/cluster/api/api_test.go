package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

var srv *kubetest.Server

func TestMain(m *testing.M) { kubetest.Main(m, func(s *kubetest.Server) { srv = s }) }

// noLeaks fails t if goroutines started during it outlive its clean-up
// (proxied streams, upgrades, the loss loop); registered first, it runs last.
func noLeaks(t *testing.T) {
	ign := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, ign)
	})
}

// cluster is one namespace with a replica in front of it.
type cluster struct {
	t          *testing.T
	ns         string
	st         *kubestore.Store
	rep        *Replica
	url        string
	token      string
	admin, key string // the admin key, alice's key
	bob        string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	ctx := t.Context()
	ns := srv.Namespace(t)
	st, err := kubestore.Open(ctx, srv.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	// Right after start the API server answers 429 "storage is
	// (re)initializing" for a while: wait until it lists.
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		_, _, err := st.ListSandboxes(ctx, store.SandboxFilter{Limit: 1})
		return err
	})
	token, err := peer.EnsureToken(ctx, srv.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, ns: ns, st: st, token: token}
	c.rep, c.url = c.replica()
	au := newAuth(st, t.TempDir())
	if c.admin, err = au.EnsureAdminKey(ctx); err != nil {
		t.Fatal(err)
	}
	if c.key, err = au.CreateKey(ctx, "alice", false); err != nil {
		t.Fatal(err)
	}
	if c.bob, err = au.CreateKey(ctx, "bob", false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutTemplate(ctx, store.Template{Name: "default", Fingerprint: "fp1", State: store.TemplateReady}); err != nil {
		t.Fatal(err)
	}
	return c
}

// replica starts one more replica over the same namespace; opts adjust
// its Config.
func (c *cluster) replica(opts ...func(*Config)) (*Replica, string) {
	au := newAuth(c.st, c.t.TempDir())
	cfg := Config{Kube: srv.Client, Namespace: c.ns, Store: c.st, Token: c.token, Auth: au, Domain: "berth.test",
		Log: slog.New(slog.NewTextHandler(c.t.Output(), nil))}
	for _, o := range opts {
		o(&cfg)
	}
	rep, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	ts := httptest.NewServer(rep.Handler())
	c.t.Cleanup(func() { ts.Close(); rep.nodes.close() })
	return rep, ts.URL
}

// fakeNode is the peer endpoint of a node: a TLS server with a node's
// identity that checks the cluster signature, and answers as handler says.
type fakeNode struct {
	name string
	ts   *httptest.Server
	id   peer.Identity
	mu   sync.Mutex
	seen []seenReq
}

type seenReq struct {
	method, path, host, sandboxID string
	principal                     peer.Principal
	signed                        bool
	header                        http.Header
	body                          string
}

func (c *cluster) node(name string, capMiB int64, h http.HandlerFunc) *fakeNode {
	c.t.Helper()
	id, err := peer.LoadOrCreateIdentity(c.t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		c.t.Fatal(err)
	}
	n := &fakeNode{name: name, id: id}
	n.ts = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok, err := peer.Verify(r, c.token)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.seen = append(n.seen, seenReq{method: r.Method, path: r.URL.Path, host: r.Host, sandboxID: r.Header.Get(peer.HeaderSandboxID),
			principal: p, signed: ok, header: r.Header.Clone(), body: string(b)})
		n.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h(w, r)
	}))
	n.ts.TLS = id.ServerTLS()
	n.ts.StartTLS()
	c.t.Cleanup(n.ts.Close)
	c.register(name, n.ts.URL, id.SHA256, capMiB, 40)
	return n
}

func (n *fakeNode) requests() []seenReq {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seenReq(nil), n.seen...)
}

// register writes a Ready Node object and a fresh Lease.
func (c *cluster) register(name, addr, hash string, capMiB int64, leaseSecs int32) {
	c.t.Helper()
	ctx := c.t.Context()
	n := berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
		ObjectMeta: kube.ObjectMeta{Name: name, Namespace: c.ns}}
	if err := srv.Client.Create(ctx, berthv1.Nodes, c.ns, &n, &n); err != nil {
		c.t.Fatal(err)
	}
	n.Status = berthv1.NodeStatus{Address: addr, CertSHA256: hash,
		Capacity: berthv1.Resources{CPUMillis: 8000, MemoryMiB: capMiB, DiskMiB: 100000},
		Runtimes: []berthv1.NodeRuntime{{Name: "runc"}},
		Conditions: []kube.Condition{{Type: berthv1.CondNodeReady, Status: "True", Reason: "Running",
			LastTransitionTime: time.Now().UTC().Truncate(time.Second)}}}
	if err := srv.Client.UpdateStatus(ctx, berthv1.Nodes, c.ns, name, &n, nil); err != nil {
		c.t.Fatal(err)
	}
	c.renew(name, time.Now(), leaseSecs)
}

// renew writes the node's Lease as renewed at t.
func (c *cluster) renew(name string, at time.Time, secs int32) {
	c.t.Helper()
	ctx := c.t.Context()
	holder := name
	l := kube.Lease{TypeMeta: kube.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: kube.ObjectMeta{Name: berthv1.NodeLeaseName(name), Namespace: c.ns},
		Spec: kube.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
			RenewTime: &kube.MicroTime{Time: at}, AcquireTime: &kube.MicroTime{Time: at}}}
	var cur kube.Lease
	err := srv.Client.Get(ctx, kube.Leases, c.ns, l.Name, &cur)
	switch {
	case errs.Is(err, errs.NotFound):
		err = srv.Client.Create(ctx, kube.Leases, c.ns, &l, nil)
	case err == nil:
		l.ResourceVersion = cur.ResourceVersion
		err = srv.Client.Update(ctx, kube.Leases, c.ns, l.Name, &l, nil)
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) do(method, url, key, body string, hdr ...string) (int, http.Header, string) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(c.t.Context(), method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// create makes a sandbox through the replica as alice.
func (c *cluster) create(body string) wire.Sandbox {
	c.t.Helper()
	st, _, b := c.do("POST", c.url+"/v1/sandboxes", c.key, body)
	var sb wire.Sandbox
	if err := json.Unmarshal([]byte(b), &sb); st != 201 || err != nil {
		c.t.Fatalf("create %s: %d %s", body, st, b)
	}
	return sb
}

// createdHandler answers a create as a node does: 201 with the sandbox,
// under the id the replica chose.
func createdHandler(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && (r.URL.Path == "/v1/sandboxes" || r.URL.Path == "/v2/sandboxes") {
		id := r.Header.Get(peer.HeaderSandboxID)
		if r.URL.Path == "/v2/sandboxes" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"sandboxID":%q,"templateID":"base","envdAccessToken":"tok"}`, id)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(wire.Sandbox{ID: id, Owner: "alice", State: "running", StartedAt: time.Now().UTC()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func TestAuthAndKeysAcrossReplicas(t *testing.T) {
	c := newCluster(t)
	for _, tc := range []struct {
		name, key string
		want      int
	}{{"no key", "", 401}, {"bad key", "e2b_00", 401}, {"tenant", c.key, 200}, {"admin", c.admin, 200}} {
		if st, _, body := c.do("GET", c.url+"/v1/sandboxes", tc.key, ""); st != tc.want {
			t.Errorf("%s: status %d (%s), want %d", tc.name, st, body, tc.want)
		}
	}
	if st, _, body := c.do("GET", c.url+"/v2/sandboxes", "", ""); st != 401 || !strings.Contains(body, `"code":401`) {
		t.Errorf("E2B without a key: %d %s", st, body)
	}
	// A key minted through one replica works on another: keys are in the store.
	st, _, body := c.do("POST", c.url+"/v1/keys", c.admin, `{"owner":"carol"}`)
	if st != 201 {
		t.Fatalf("create key: %d %s", st, body)
	}
	var kr wire.KeyResponse
	_ = json.Unmarshal([]byte(body), &kr)
	_, url2 := c.replica()
	if st, _, body := c.do("GET", url2+"/v1/sandboxes", kr.Key, ""); st != 200 {
		t.Fatalf("carol's key on the second replica: %d %s", st, body)
	}
	if st, _, _ := c.do("POST", c.url+"/v1/keys", c.key, `{"owner":"mallory"}`); st != 403 {
		t.Fatalf("a tenant minting keys: %d, want 403", st)
	}
	// What a replica does not serve (the console) says so.
	if st, _, body := c.do("GET", c.url+"/ui", c.admin, ""); st != 501 || !strings.Contains(body, "cluster") {
		t.Fatalf("the console on a replica: %d %s", st, body)
	}
}

// A create is placed, bound, and forwarded signed as its caller; lists
// and gets read the objects, scoped to the owner.
func TestCreateForwardListGet(t *testing.T) {
	c := newCluster(t)
	n := c.node("n1", 16384, createdHandler)
	// The client tries to pass for the admin and to pick the id: both stripped.
	st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":1024,"expected_duration":"short","labels":{"a":"b"}}`,
		peer.HeaderPrincipal, `{"owner":"admin","admin":true}`, peer.HeaderToken, "forged", peer.HeaderSandboxID, "chosen")
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	var got wire.Sandbox
	if err := json.Unmarshal([]byte(body), &got); err != nil || !sandbox.ValidID(got.ID) {
		t.Fatalf("create answer %s: %v", body, err)
	}
	reqs := n.requests()
	if len(reqs) != 1 {
		t.Fatalf("node saw %d requests, want 1", len(reqs))
	}
	r0 := reqs[0]
	if !r0.signed || r0.principal != (peer.Principal{Owner: "alice"}) || r0.sandboxID != got.ID {
		t.Fatalf("forwarded create: signed %v principal %+v id %q (answer id %q)", r0.signed, r0.principal, r0.sandboxID, got.ID)
	}
	if r0.header.Get("X-Api-Key") != "" || !strings.Contains(r0.body, `"expected_duration":"short"`) {
		t.Fatalf("forwarded create carries the API key or lost the body: %v %s", r0.header, r0.body)
	}
	sb, err := c.st.GetSandbox(t.Context(), got.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Attrs.Cluster.Node != "n1" || sb.Attrs.Cluster.DurationClass != "short" || sb.Owner != "alice" ||
		sb.Resources.MemoryMiB != 1024 || sb.State != sandbox.Running || sb.TemplateID != "fp1" {
		t.Fatalf("object: node %q class %q owner %q mem %d state %s fp %q", sb.Attrs.Cluster.Node, sb.Attrs.Cluster.DurationClass,
			sb.Owner, sb.Resources.MemoryMiB, sb.State, sb.TemplateID)
	}

	var list wire.ListResponse
	_, _, body = c.do("GET", c.url+"/v1/sandboxes?label=a=b", c.key, "")
	_ = json.Unmarshal([]byte(body), &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != got.ID || list.Sandboxes[0].Extra["node"] != "n1" {
		t.Fatalf("alice's list: %s", body)
	}
	_, _, body = c.do("GET", c.url+"/v1/sandboxes", c.bob, "")
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Sandboxes) != 0 {
		t.Fatalf("bob sees alice's sandbox: %s", body)
	}
	if st, _, _ := c.do("GET", c.url+"/v1/sandboxes/"+got.ID, c.bob, ""); st != 404 {
		t.Fatalf("bob gets alice's sandbox: %d", st)
	}
	if st, _, _ := c.do("POST", c.url+"/v1/sandboxes/"+got.ID+"/stop", c.bob, ""); st != 404 {
		t.Fatalf("bob stops alice's sandbox: %d", st)
	}
	if st, _, body := c.do("GET", c.url+"/v1/sandboxes/"+got.ID, c.admin, ""); st != 200 || !strings.Contains(body, `"node": "n1"`) {
		t.Fatalf("admin gets it: %d %s", st, body)
	}
	_, _, body = c.do("GET", c.url+"/v2/sandboxes", "", "", "X-API-KEY", c.key)
	if !strings.Contains(body, got.ID) || !strings.Contains(body, `"state":"running"`) {
		t.Fatalf("E2B list: %s", body)
	}
	_, _, body = c.do("GET", c.url+"/sandboxes", "", "", "X-API-KEY", c.bob)
	if body != "[]\n" {
		t.Fatalf("bob's E2B list: %q", body)
	}

	// E2B create: forwarded as is; the answer is the node's.
	st, _, body = c.do("POST", c.url+"/v2/sandboxes", "", `{"templateID":"base","timeout":60}`, "X-API-KEY", c.key)
	if st != 201 || !strings.Contains(body, `"envdAccessToken":"tok"`) {
		t.Fatalf("E2B create: %d %s", st, body)
	}
	st, _, body = c.do("POST", c.url+"/v2/sandboxes", "", `{"templateID":"nope"}`, "X-API-KEY", c.key)
	if st != 400 || !strings.Contains(body, "templateID") {
		t.Fatalf("E2B create of an unknown template: %d %s", st, body)
	}
}

// A node's refusal costs the object and one try on the next-best node;
// when nothing fits the answer says why.
func TestCreateRetryAndNoFit(t *testing.T) {
	c := newCluster(t)
	full := c.node("a-full", 16384, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"code":429,"message":"node is full","reason":"resource_exhausted"}`)
	})
	// The empty, larger node costs more to open: placement prefers the
	// small one (best fit), which refuses.
	ok := c.node("b-ok", 65536, createdHandler)
	st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":8192}`)
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	if len(full.requests()) != 1 || len(ok.requests()) != 1 {
		t.Fatalf("requests: full %d, ok %d; want 1 and 1", len(full.requests()), len(ok.requests()))
	}
	refusedID := full.requests()[0].sandboxID
	if _, err := c.st.GetSandbox(t.Context(), refusedID); !errs.Is(err, errs.NotFound) {
		t.Fatalf("the refused create's object: %v, want it gone", err)
	}
	st, _, body = c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":100000}`)
	if st != 429 || !strings.Contains(body, "no node fits (of 2)") || !strings.Contains(body, "memory on 2 nodes") {
		t.Fatalf("no fit: %d %s", st, body)
	}
}

// Requests about one sandbox go to its node: signed REST, unsigned envd
// (routed by header or host), streamed as they come, upgrades included.
func TestProxy(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	release := make(chan struct{})
	n := c.node("n1", 16384, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/exec"):
			w.WriteHeader(200)
			_, _ = io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "second\n")
		case strings.HasSuffix(r.URL.Path, "/fork"):
			w.WriteHeader(http.StatusCreated)
			if strings.HasPrefix(r.URL.Path, "/v1/") {
				_ = json.NewEncoder(w).Encode(wire.ForkResult{Parent: "p", Sandboxes: []wire.Sandbox{{ID: "forkchild1", Owner: "alice", State: "running"}}})
			} else {
				_, _ = io.WriteString(w, `[{"sandbox":{"sandboxID":"forkchild2","templateID":"base"}}]`)
			}
		case r.Header.Get("Upgrade") == "websocket":
			conn, brw, _ := w.(http.Hijacker).Hijack()
			defer conn.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			line, _ := brw.ReadString('\n')
			_, _ = brw.WriteString("echo " + line)
			_ = brw.Flush()
		default:
			createdHandler(w, r)
		}
	})
	sb := c.create(`{}`)

	// A stream: the first chunk arrives before the node ends the answer.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", c.url+"/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["ls"]}`))
	req.Header.Set("Authorization", "Bearer "+c.key)
	// A client of its own: nothing else's idle-connection clean-up
	// (httptest servers closing elsewhere) can touch the stream's connection.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if l, err := br.ReadString('\n'); err != nil || l != "first\n" {
		rest, _ := io.ReadAll(br)
		t.Fatalf("first chunk: %d %q %v %s", resp.StatusCode, l, err, rest)
	}
	close(release)
	if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
		t.Fatalf("rest: %q", rest)
	}
	resp.Body.Close()
	last := n.requests()[len(n.requests())-1]
	if !last.signed || last.principal.Owner != "alice" || last.header.Get("Authorization") != "" {
		t.Fatalf("exec forwarded: signed %v principal %+v auth %q", last.signed, last.principal, last.header.Get("Authorization"))
	}

	// envd by header: unsigned, the access token passed on for the node to check.
	st, _, _ := c.do("GET", c.url+"/health", "", "", "E2b-Sandbox-Id", sb.ID, "X-Access-Token", "tok")
	last = n.requests()[len(n.requests())-1]
	if st != 204 || last.signed || last.path != "/health" || last.header.Get("X-Access-Token") != "tok" {
		t.Fatalf("envd: %d signed %v path %s", st, last.signed, last.path)
	}
	// envd by host name: the Host reaches the node unchanged.
	req, _ = http.NewRequestWithContext(t.Context(), "GET", c.url+"/files?path=/etc/hostname", nil)
	req.Host = "49983-" + sb.ID + ".berth.test"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	last = n.requests()[len(n.requests())-1]
	if last.host != req.Host || last.signed {
		t.Fatalf("host-routed envd reached the node with host %q signed %v", last.host, last.signed)
	}
	if st, _, _ := c.do("GET", c.url+"/health", "", "", "E2b-Sandbox-Id", "nosuchsandbox"); st != 404 {
		t.Fatalf("envd of an unknown sandbox: %d", st)
	}

	// An upgrade passes through both ways.
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/processes/1/attach HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", sb.ID, c.key)
	cr := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, _ := cr.ReadString('\n')
	if !strings.Contains(status, "101") {
		t.Fatalf("upgrade answer: %q", status)
	}
	for {
		l, err := cr.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "\r\n" {
			break
		}
	}
	fmt.Fprintf(conn, "hello\n")
	if l, _ := cr.ReadString('\n'); l != "echo hello\n" {
		t.Fatalf("through the upgrade: %q", l)
	}

	// A fork's children, made on the node, get objects bound to it.
	st, _, body := c.do("POST", c.url+"/v1/sandboxes/"+sb.ID+"/fork", c.key, `{"count":1}`)
	if st != 201 {
		t.Fatalf("fork: %d %s", st, body)
	}
	child, err := c.st.GetSandbox(t.Context(), "forkchild1")
	if err != nil || child.Attrs.Cluster.Node != "n1" || child.Owner != "alice" || child.Attrs.Lineage.Parent != sb.ID {
		t.Fatalf("fork child object: %+v %v", child, err)
	}
	if !strings.Contains(body, "forkchild1") {
		t.Fatalf("fork answer not passed on: %s", body)
	}
	st, _, body = c.do("POST", c.url+"/sandboxes/"+sb.ID+"/fork", "", `{}`, "X-API-KEY", c.key)
	if _, err := c.st.GetSandbox(t.Context(), "forkchild2"); st != 201 || err != nil {
		t.Fatalf("E2B fork: %d %s; child object: %v", st, body, err)
	}
	if st, _, body := c.do("GET", c.url+"/v1/info", c.key, ""); st != 200 || !strings.Contains(body, `"name": "runc"`) || !strings.Contains(body, `"cpus": 8`) {
		t.Fatalf("info: %d %s", st, body)
	}

	// A node that does not answer: 503 naming it.
	n.ts.Close()
	st, _, body = c.do("POST", c.url+"/v1/sandboxes/"+sb.ID+"/pause", c.key, `{}`)
	if st != 503 || !strings.Contains(body, "node n1") {
		t.Fatalf("unreachable node: %d %s", st, body)
	}
	// The replica's /metrics counted the upgrade (once it ended) and the
	// node that did not answer.
	conn.Close()
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		_, _, m := c.do("GET", c.url+"/metrics", c.admin, "")
		for _, line := range []string{`berth_replica_requests_total{route="/v1/sandboxes/{id}/{rest...}",code="101"} 1`,
			`berth_replica_forward_errors_total{node="n1"} 1`} {
			if !strings.Contains(m, line+"\n") {
				return fmt.Errorf("/metrics lacks %s:\n%s", line, m)
			}
		}
		return nil
	})
}

// A node refusing the replica's signature is the channel's fault, not the
// client's: 503 naming the node, never the node's 401 passed on.
func TestNodeRefusesToken(t *testing.T) {
	c := newCluster(t)
	c.node("strict", 16384, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad cluster token", http.StatusUnauthorized)
	})
	st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{}`)
	if st != 503 || !strings.Contains(body, "node strict refused this replica's cluster token") {
		t.Fatalf("create on a node refusing the token: %d %s", st, body)
	}
	var list wire.ListResponse
	_, _, body = c.do("GET", c.url+"/v1/sandboxes", c.key, "")
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Sandboxes) != 0 {
		t.Fatalf("the refused create left an object: %s", body)
	}
}

func newAuth(st *kubestore.Store, dir string) *auth.Service { return auth.New(st, dir, nil, nil) }

package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/e2b"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/oci"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/server"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/testutil"
)

var srv *kubetest.Server

// TestMain is kubetest.Main plus the clean-up of the binaries and the
// template tarball this package's tests build.
func TestMain(m *testing.M) {
	s, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetest:", err)
		if os.Getenv("CI") == "true" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	srv = s
	code := m.Run()
	s.Stop()
	if code == 0 {
		// The agents, daemons and peer listeners the tests started are gone
		// (idle keep-alive connections of the shared Kubernetes client aside).
		if err := goleak.Find(goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	testutil.RemoveBinaries()
	if tinyPath != "" {
		_ = os.Remove(tinyPath)
	}
	os.Exit(code)
}

// host is one node: a real daemon (real runc, real SQLite) wrapped by the
// agent, its HTTP surface on a TLS peer listener, against a real
// kube-apiserver.
type host struct {
	d       *daemon.Daemon
	local   *node.LocalStore
	ks      *kubestore.Store
	kc      *kube.Client
	ns      string
	name    string
	token   string
	id      peer.Identity
	peerURL string
	tpl     store.Template
	logs    *lockedWriter
}

func startHost(t *testing.T) *host { return startHostResync(t, 500*time.Millisecond) }

// startHostResync starts a host whose agent's periodic pass runs every resync.
func startHostResync(t *testing.T, resync time.Duration) *host {
	t.Helper()
	return startHostWith(t, hostOpts{resync: resync})
}

// hostOpts: ns "" is a fresh namespace, name "" is n1; noTemplate leaves
// the host without the tiny template.
type hostOpts struct {
	resync     time.Duration
	ns, name   string
	noTemplate bool
	pools      node.PoolSizing
	// createGrace: the agent's (default 500ms).
	createGrace time.Duration
	// adoptGrace: the agent's (0: its default).
	adoptGrace time.Duration
}

func startHostWith(t *testing.T, o hostOpts) *host {
	t.Helper()
	resync := o.resync
	testutil.RequireRoot(t)
	runc := testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	ctx := t.Context()
	ns := o.ns
	if ns == "" {
		ns = srv.Namespace(t)
	}
	kc := srv.Client
	ks, err := kubestore.Open(ctx, kc, ns)
	if err != nil {
		t.Fatal(err)
	}
	token, err := peer.EnsureToken(ctx, kc, ns)
	if err != nil {
		t.Fatal(err)
	}
	dataDir, err := os.MkdirTemp("", "bn") // short: agent socket paths live below it
	if err != nil {
		t.Fatal(err)
	}
	if o.name == "" {
		o.name = "n1"
	}
	h := &host{ks: ks, kc: kc, ns: ns, name: o.name, token: token, logs: &lockedWriter{}}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := store.OpenSQLite(filepath.Join(dataDir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	h.local = node.NewLocalStore(st)
	tpls, err := template.Open(dataDir, log)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := oci.New("runc", oci.Config{Binary: runc, Root: filepath.Join(dataDir, "runtime", "runc"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.d, err = daemon.New(daemon.Config{DataDir: dataDir, AgentPath: filepath.Join(bin, "berth-agent"), Log: log,
		ClusterToken: token, ClusterNode: h.name}, h.local, map[string]runtime.Runtime{"runc": rt}, tpls)
	if err != nil {
		t.Fatal(err)
	}
	h.d.Run()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node logs:\n%s", h.logs.String())
		}
		h.drain(t)
		h.d.Close()
		if left, _, _ := st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(left) > 0 {
			for _, sb := range left {
				t.Errorf("sandbox %s (owner %s) is %s after the daemon closed", sb.ID, sb.Owner, sb.State)
			}
		}
		st.Close()
		testutil.RemoveAllChecked(t, dataDir)
	})
	if !o.noTemplate {
		f, err := os.Open(tinyTar(t))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if h.tpl, err = h.d.Templates().Import(ctx, "tiny", f, "tiny.tar"); err != nil {
			t.Fatal(err)
		}
	}

	h.id, err = peer.LoadOrCreateIdentity(filepath.Join(dataDir, "peer"), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.peerURL = "https://" + ln.Addr().String()
	grace := o.createGrace
	if grace == 0 {
		grace = 500 * time.Millisecond
	}
	ag, err := node.New(node.Config{Kube: kc, Namespace: ns, Name: h.name, Daemon: h.d, Local: h.local, Cluster: ks,
		Address: h.peerURL, CertSHA256: h.id.SHA256, LeaseDuration: 4 * time.Second,
		CreateGrace: grace, AdoptGrace: o.adoptGrace, Resync: resync, Version: "test", PoolSizing: o.pools, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	// As berth node's peer listener: layers, then serve's routes (without a network).
	handler := node.PeerHandler(h.d, token, ag.Prefetch(
		h.d.Auth().ClusterGate(e2b.New(h.d, log, e2b.Options{}).Handler(server.New(h.d, log)))))
	hs := &http.Server{Handler: handler, TLSConfig: h.id.ServerTLS(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })

	if err := ag.Register(ctx); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ag.Run(actx) }()
	t.Cleanup(func() { cancel(); <-done }) // before the daemon closes (cleanups run last first)
	return h
}

// drain deletes every sandbox of the host and waits until their teardowns
// have finished (a row goes last), so that Close leaves nothing running:
// Close keeps sandboxes running on purpose (the next start adopts them),
// and no next start will come for this data dir. The agent has stopped by
// now, but the daemon's own pool loop refills a pool whose members are
// deleted (the leak this harness had: two running members per
// TestWarmPoolPerNode run, boot finished during Close): pools go to size
// 0 first and the drain waits for members still starting.
func (h *host) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pools, err := h.d.Pools().List(ctx)
	if err != nil {
		t.Errorf("drain: list pools: %v", err)
	}
	for _, p := range pools {
		spec := p.Spec
		spec.Size, spec.Auto, spec.Min, spec.Max = 0, false, 0, 0
		if _, err := h.d.Pools().Set(ctx, spec); err != nil {
			t.Errorf("drain: empty pool %s: %v", spec.Template, err)
		}
	}
	err = testutil.Within(80 * time.Second).Until(func() error {
		pools, err := h.d.Pools().List(ctx)
		if err != nil {
			return err
		}
		for _, p := range pools {
			if p.Starting > 0 {
				return fmt.Errorf("pool %s still starting %d members", p.Template, p.Starting)
			}
		}
		list, _, err := h.d.Store().ListSandboxes(ctx, store.SandboxFilter{})
		if err != nil {
			return err
		}
		var left []string
		for _, sb := range list {
			left = append(left, sb.ID+" "+string(sb.State))
			if sb.State == sandbox.Deleted {
				continue // its teardown is under way
			}
			if err := h.d.Delete(ctx, "", sb.ID); err != nil && !errs.Is(err, errs.NotFound) {
				return fmt.Errorf("delete %s (%s): %w", sb.ID, sb.State, err)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("sandboxes not torn down yet: %s", strings.Join(left, ", "))
		}
		return nil
	})
	if err != nil {
		t.Errorf("drain host %s: %v", h.name, err)
	}
}

// bind writes a Sandbox object bound to the node, as a replica's create does.
func (h *host) bind(t *testing.T, owner string) *sandbox.Sandbox {
	t.Helper()
	now := time.Now().UTC()
	sb := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: owner, Template: "tiny", State: sandbox.Creating,
		Labels: map[string]string{"task": "t1"}, Resources: sandbox.Resources{CPUMillis: 500, MemoryMiB: 128, DiskMiB: 256, Pids: 128},
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), ExpiryAction: sandbox.ExpireStop,
		Attrs: sandbox.Attrs{Cluster: sandbox.ClusterState{Node: h.name, BoundAt: now}}}
	if err := h.ks.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

func (h *host) waitObject(t *testing.T, id string, ok func(*sandbox.Sandbox) bool, what string) *sandbox.Sandbox {
	t.Helper()
	var last *sandbox.Sandbox
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		o, err := h.ks.GetSandbox(t.Context(), id)
		if err != nil {
			return err
		}
		last = o
		if !ok(o) {
			return fmt.Errorf("object %s is %s (%s), want %s", id, o.State, o.Reason, what)
		}
		return nil
	})
	return last
}

func (h *host) waitLocalGone(t *testing.T, id string) {
	t.Helper()
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		sb, err := h.d.Store().GetSandbox(t.Context(), id)
		if errs.Is(err, errs.NotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("local sandbox %s still %s", id, sb.State)
	})
}

func (h *host) hasEvent(t *testing.T, id, reason string) {
	t.Helper()
	evs, err := h.d.Store().ListEvents(t.Context(), store.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == "cluster_delete" && e.Reason == reason && e.Actor == "cluster" {
			return
		}
	}
	t.Fatalf("no cluster_delete event with reason %s for %s; events: %+v", reason, id, evs)
}

// TestNodeRegisters: the Node carries the peer address and certificate
// hash, capacity, runtimes, the cached template and Ready; the Lease is
// held by the node and renewed; the template is published.
func TestNodeRegisters(t *testing.T) {
	h := startHost(t)
	ctx := t.Context()
	var n berthv1.Node
	if err := h.kc.Get(ctx, berthv1.Nodes, h.ns, h.name, &n); err != nil {
		t.Fatal(err)
	}
	s := n.Status
	if s.Address != h.peerURL || s.CertSHA256 != h.id.SHA256 || len(s.CertSHA256) != 64 {
		t.Errorf("address %q cert %q, want %q %q", s.Address, s.CertSHA256, h.peerURL, h.id.SHA256)
	}
	if s.Capacity.CPUMillis < 1000 || s.Capacity.MemoryMiB < 64 || s.Capacity.DiskMiB < 64 {
		t.Errorf("capacity %+v", s.Capacity)
	}
	if len(s.Runtimes) != 1 || s.Runtimes[0].Name != "runc" {
		t.Errorf("runtimes %+v", s.Runtimes)
	}
	if !slices.Contains(s.CachedTemplates, h.tpl.Fingerprint) {
		t.Errorf("cached templates %v, want %s", s.CachedTemplates, h.tpl.Fingerprint)
	}
	if c := kube.FindCondition(s.Conditions, berthv1.CondNodeReady); c == nil || c.Status != "True" || s.Heartbeat == nil {
		t.Errorf("conditions %+v heartbeat %v", s.Conditions, s.Heartbeat)
	}
	if tp, err := h.ks.GetTemplate(ctx, "tiny"); err != nil || tp.Fingerprint != h.tpl.Fingerprint {
		t.Errorf("published template %+v, %v", tp, err)
	}
	// The Lease: held by the node, renewed every quarter of its 4 s.
	var l kube.Lease
	if err := h.kc.Get(ctx, kube.Leases, h.ns, berthv1.NodeLeaseName(h.name), &l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != h.name || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 4 {
		t.Fatalf("lease spec %+v", l.Spec)
	}
	first := l.Spec.RenewTime.Time
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		var l2 kube.Lease
		if err := h.kc.Get(ctx, kube.Leases, h.ns, berthv1.NodeLeaseName(h.name), &l2); err != nil {
			return err
		}
		if !l2.Spec.RenewTime.After(first) {
			return fmt.Errorf("lease renewTime still %s", l2.Spec.RenewTime.Time)
		}
		return nil
	})
}

// TestNodeRunsBoundSandboxes: an object bound to the node is created here
// with its id and goes running; a local pause shows in the object; deleting
// the object deletes the local sandbox (an event says why); the Node counts
// what is allocated.
func TestNodeRunsBoundSandboxes(t *testing.T) {
	h := startHost(t)
	ctx := t.Context()
	obj := h.bind(t, "alice")
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	local, err := h.d.Store().GetSandbox(ctx, obj.ID)
	if err != nil {
		t.Fatal(err)
	}
	if local.Owner != "alice" || local.Template != "tiny" || local.Labels["task"] != "t1" || local.Resources.MemoryMiB != 128 ||
		local.Attrs.Cluster.Node != h.name {
		t.Fatalf("local sandbox %+v", local)
	}
	testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
		var n berthv1.Node
		if err := h.kc.Get(ctx, berthv1.Nodes, h.ns, h.name, &n); err != nil {
			return err
		}
		if n.Status.Allocated.MemoryMiB != 128 || n.Status.Allocated.CPUMillis != 500 {
			return fmt.Errorf("allocated %+v", n.Status.Allocated)
		}
		return nil
	})

	if _, err := h.d.Checkpoints().Pause(ctx, "alice", obj.ID, sandbox.PauseDisk); err != nil {
		t.Fatal(err)
	}
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool {
		return o.State == sandbox.Paused && o.PauseActual == sandbox.PauseDisk
	}, "paused (disk)")

	if err := h.ks.DeleteSandbox(ctx, obj.ID); err != nil {
		t.Fatal(err)
	}
	h.waitLocalGone(t, obj.ID)
	h.hasEvent(t, obj.ID, node.ReasonObjectGone)
}

// TestNodeServesReplicas: a replica's signed create (REST and E2B) makes
// the sandbox with the replica's id, as the principal it names; a forged
// token and a duplicate id are refused; a local delete removes the object;
// an object marked lost makes the node stop and delete its sandbox, and
// the object stays lost.
func TestNodeServesReplicas(t *testing.T) {
	h := startHost(t)
	ctx := t.Context()
	hc := &http.Client{Transport: peer.Transport(h.id.SHA256), Timeout: 60 * time.Second}
	post := func(path, id, token string, body any) (int, []byte) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, "POST", h.peerURL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		peer.Sign(req, token, peer.Principal{Owner: "bob"})
		req.Header.Set(peer.HeaderSandboxID, id)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}

	// REST, as the replica does it: the object first, then the forwarded create.
	obj := h.bind(t, "bob")
	if code, out := post("/v1/sandboxes", obj.ID, peer.NewToken(), map[string]any{"template": "tiny"}); code != http.StatusUnauthorized {
		t.Fatalf("forged token: %d %s", code, out)
	}
	code, out := post("/v1/sandboxes", obj.ID, h.token, map[string]any{"template": "tiny", "memory_mib": 128})
	if code != http.StatusCreated {
		t.Fatalf("signed create: %d %s", code, out)
	}
	var got struct{ ID, Owner, State string }
	_ = json.Unmarshal(out, &got)
	if got.ID != obj.ID || got.Owner != "bob" || got.State != "running" {
		t.Fatalf("created %+v, want id %s owner bob running", got, obj.ID)
	}
	if code, out := post("/v1/sandboxes", obj.ID, h.token, map[string]any{"template": "tiny"}); code != http.StatusConflict {
		t.Fatalf("duplicate id: %d %s", code, out)
	}
	if code, out := post("/v1/sandboxes", "Not/An/Id", h.token, map[string]any{"template": "tiny"}); code != http.StatusBadRequest ||
		!strings.Contains(string(out), peer.HeaderSandboxID) {
		t.Fatalf("bad id: %d %s", code, out)
	}
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running && o.AccessTokenHash != "" }, "running")

	// E2B, likewise.
	obj2 := h.bind(t, "bob")
	code, out = post("/sandboxes", obj2.ID, h.token, map[string]any{"templateID": "tiny"})
	if code != http.StatusCreated || !strings.Contains(string(out), `"sandboxID": "`+obj2.ID+`"`) && !strings.Contains(string(out), `"sandboxID":"`+obj2.ID+`"`) {
		t.Fatalf("signed E2B create: %d %s", code, out)
	}

	// A local delete marks the object deleted (a replica removes it).
	if err := h.d.Delete(ctx, "bob", obj.ID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		// The node marks the object deleted; a replica removes it.
		if o, err := h.ks.GetSandbox(ctx, obj.ID); !errs.Is(err, errs.NotFound) && (err != nil || o.State != sandbox.Deleted) {
			return fmt.Errorf("object not marked deleted: %v", err)
		}
		return nil
	})

	// Lost: the node stops and deletes it, and leaves the object lost.
	h.waitObject(t, obj2.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	if _, err := h.ks.UpdateSandbox(ctx, obj2.ID, func(o *sandbox.Sandbox) error {
		o.State, o.Reason = sandbox.Lost, "node_lost"
		o.Attrs.Cluster.LostAt = time.Now().UTC()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.waitLocalGone(t, obj2.ID)
	h.hasEvent(t, obj2.ID, node.ReasonNodeLost)
	if o, err := h.ks.GetSandbox(ctx, obj2.ID); err != nil || o.State != sandbox.Lost {
		t.Fatalf("lost object after the local delete: %+v, %v", o, err)
	}
}

var tinyPath string

func tinyTar(t *testing.T) string {
	t.Helper()
	if tinyPath != "" {
		return tinyPath
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(os.TempDir(), fmt.Sprintf("berth-node-tiny-%d.tar", os.Getpid()))
	if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", p, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	tinyPath = p
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestNodeMirrorsOnLocalChange: with no periodic pass (an hour apart), the
// object still follows each local transition — the daemon's store writes
// wake the agent — so a replica reading right after a pause sees paused.
func TestNodeMirrorsOnLocalChange(t *testing.T) {
	h := startHostResync(t, time.Hour)
	ctx := t.Context()
	obj := h.bind(t, "dave")
	hc := &http.Client{Transport: peer.Transport(h.id.SHA256), Timeout: 60 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, "POST", h.peerURL+"/v1/sandboxes", strings.NewReader(`{"template":"tiny"}`))
	peer.Sign(req, h.token, peer.Principal{Owner: "dave"})
	req.Header.Set(peer.HeaderSandboxID, obj.ID)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("signed create: %d", resp.StatusCode)
	}
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	if _, err := h.d.Checkpoints().Pause(ctx, "dave", obj.ID, sandbox.PauseDisk); err != nil {
		t.Fatal(err)
	}
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool {
		return o.State == sandbox.Paused && o.PauseActual == sandbox.PauseDisk
	}, "paused (disk)")
}

// TestNodeObjectRecreated: an operator deleting the Node object of a live
// node (kubectl delete bnode X) gets it back at the agent's next status
// write, Ready with its address; the sandboxes bound to it go on running
// and their objects are untouched (replicas leave a node with a fresh
// Lease alone, Node object or not: cluster/api's nodeloss.go).
func TestNodeObjectRecreated(t *testing.T) {
	h := startHost(t)
	ctx := t.Context()
	obj := h.bind(t, "hal")
	h.waitObject(t, obj.ID, func(o *sandbox.Sandbox) bool { return o.State == sandbox.Running }, "running")
	var before berthv1.Node
	if err := h.kc.Get(ctx, berthv1.Nodes, h.ns, h.name, &before); err != nil {
		t.Fatal(err)
	}
	if err := h.kc.Delete(ctx, berthv1.Nodes, h.ns, h.name, kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
		var n berthv1.Node
		if err := h.kc.Get(ctx, berthv1.Nodes, h.ns, h.name, &n); err != nil {
			return err
		}
		if n.UID == before.UID {
			return fmt.Errorf("node %s not deleted yet", h.name)
		}
		if c := kube.FindCondition(n.Status.Conditions, berthv1.CondNodeReady); c == nil || c.Status != "True" ||
			n.Status.Address != h.peerURL || n.Status.CertSHA256 != h.id.SHA256 || n.Status.Allocated.MemoryMiB != 128 {
			return fmt.Errorf("re-created node's status %+v", n.Status)
		}
		return nil
	})
	o, err := h.ks.GetSandbox(ctx, obj.ID)
	if err != nil || o.State != sandbox.Running || o.Attrs.Cluster.Node != h.name {
		t.Fatalf("sandbox object after its Node was re-created: %+v, %v", o, err)
	}
	if _, err := h.d.Store().GetSandbox(ctx, obj.ID); err != nil {
		t.Fatalf("local sandbox after its Node was re-created: %v", err)
	}
}

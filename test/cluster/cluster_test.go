package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/testutil"
)

func execReq(cmd ...string) wire.ExecRequest { return wire.ExecRequest{Cmd: cmd, Timeout: "60s"} }

// cluster is the running whole: nodes, replicas, the admin's kube client.
type cluster struct {
	t        *testing.T
	nodes    []*node
	replicas []*proc
	kc       *kube.Client
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

func (c *cluster) procs() []*proc {
	var out []*proc
	for _, n := range c.nodes {
		out = append(out, &n.proc)
	}
	return append(out, c.replicas...)
}

func (c *cluster) sandboxObj(id string) (*berthv1.Sandbox, error) {
	var sb berthv1.Sandbox
	err := c.kc.Get(context.Background(), berthv1.Sandboxes, ns, id, &sb)
	return &sb, err
}

// kubectl logs what an operator would see (the CRDs' printer columns).
func (c *cluster) kubectl(args ...string) {
	bin := srv.Kubectl()
	if bin == "" {
		return
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", srv.Kubeconfig(c.t, "", ns)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		return
	}
	c.t.Logf("$ kubectl -n %s %s\n%s", ns, strings.Join(args, " "), out)
}

// startCluster applies deploy/'s namespace and RBAC, starts three nodes
// (each with the tiny template imported through its local admin listener)
// and two replicas, and waits until every node is Ready in its Node object
// and has published the template.
func startCluster(t *testing.T) *cluster {
	testutil.RequireRoot(t)
	for _, tool := range []string{"runc", "ip", "nft", "tar"} {
		testutil.RequireTool(t, tool)
	}
	ctx := context.Background()
	root := kubetest.RepoRoot()
	for _, f := range []string{"00-namespace.yaml", "10-rbac.yaml"} {
		if err := kubetest.Apply(ctx, srv.Client, filepath.Join(root, "deploy", f), ns); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}
	bin := testutil.BuildBinaries(t)
	c := &cluster{t: t, kc: srv.Client}
	nodeKC, apiKC := srv.Kubeconfig(t, nodeToken, ns), srv.Kubeconfig(t, apiToken, ns)
	tiny := tinyTar(t)
	for i := range 3 {
		n := &node{proc: proc{t: t, name: fmt.Sprintf("node%d", i+1), bin: bin, dataDir: shortDir(t, "bk"),
			url: "http://" + freeAddr(t)}, peer: freeAddr(t), netArgs: testNetwork(t)}
		n.setArgs(nodeKC)
		t.Cleanup(func() { n.cleanup(t) })
		n.start()
		if out, err := n.cli("template", "import", "tiny", tiny); err != nil {
			t.Fatalf("%s: template import: %v: %s", n.name, err, out)
		}
		c.nodes = append(c.nodes, n)
	}
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		for _, n := range c.nodes {
			var obj berthv1.Node
			if err := c.kc.Get(ctx, berthv1.Nodes, ns, n.name, &obj); err != nil {
				return err
			}
			if cond := kube.FindCondition(obj.Status.Conditions, berthv1.CondNodeReady); cond == nil || cond.Status != "True" {
				return fmt.Errorf("node %s not Ready: %+v", n.name, obj.Status.Conditions)
			}
			if len(obj.Status.CertSHA256) != 64 || obj.Status.Address == "" || obj.Status.Capacity.MemoryMiB == 0 {
				return fmt.Errorf("node %s status incomplete: %+v", n.name, obj.Status)
			}
			if !slices.ContainsFunc(obj.Status.Runtimes, func(r berthv1.NodeRuntime) bool { return r.Name == "runc" }) {
				return fmt.Errorf("node %s reports runtimes %+v", n.name, obj.Status.Runtimes)
			}
			var l kube.Lease
			if err := c.kc.Get(ctx, kube.Leases, ns, berthv1.NodeLeaseName(n.name), &l); err != nil {
				return err
			}
		}
		var tl berthv1.TemplateList
		if err := c.kc.List(ctx, berthv1.Templates, ns, kube.ListOptions{}, &tl); err != nil {
			return err
		}
		if !slices.ContainsFunc(tl.Items, func(tp berthv1.Template) bool { return tp.Spec.Name == "tiny" }) {
			return fmt.Errorf("template tiny not published (%d templates)", len(tl.Items))
		}
		return nil
	})
	for i := range 2 {
		r := &proc{t: t, name: fmt.Sprintf("replica%d", i+1), bin: bin, dataDir: shortDir(t, "br"), url: "http://" + freeAddr(t)}
		r.args = []string{"serve", "--cluster", "--kubeconfig", apiKC, "--namespace", ns,
			"--listen", strings.TrimPrefix(r.url, "http://"), "--data-dir", r.dataDir}
		t.Cleanup(func() {
			r.stop()
			if t.Failed() {
				t.Logf("== %s log:\n%s", r.name, r.tail())
			}
			_ = os.RemoveAll(r.dataDir)
		})
		r.start()
		c.replicas = append(c.replicas, r)
	}
	return c
}

// TestCluster is issue 16's end-to-end list: 30 sandboxes created through
// the REST API of alternating replicas land where placement bound them and
// answer exec through either replica; pause, resume and fork work through a
// replica on the node that runs the sandbox; a SIGKILLed node's sandboxes
// go lost within the lease period and new creates avoid it; restarted, it
// stops its lost sandboxes and nothing runs twice.
func TestCluster(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	admin := c.replicas[0].client(c.replicas[0].key)
	if err := c.replicas[1].client(c.replicas[0].key).Health(ctx); err != nil {
		t.Fatal(err)
	}
	// A user's key, made on one replica, works on the other: keys live in
	// the cluster's store.
	k, err := admin.CreateKey(ctx, "alice")
	if err != nil {
		t.Fatalf("create key through replica1: %v", err)
	}
	alice := []*client.Client{c.replicas[0].client(k.Key), c.replicas[1].client(k.Key)}

	// 30 creates, alternating replicas, three at a time.
	const total = 30
	ids := make([]string, total)
	var wg sync.WaitGroup
	errc := make(chan error, total)
	sem := make(chan struct{}, 3)
	start := time.Now()
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := alice[i%2].Create(ctx, wire.CreateRequest{Template: "tiny", CPU: 0.25, MemoryMiB: 64,
				Labels: map[string]string{"n": fmt.Sprint(i)}})
			if err != nil {
				errc <- fmt.Errorf("create %d through replica%d: %w", i, i%2+1, err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("30 creates through 2 replicas in %s", time.Since(start).Round(time.Millisecond))

	// Each object is bound to a node, the sandbox runs there and only
	// there, and it answers exec through both replicas.
	byNode := map[string][]string{}
	for i, id := range ids {
		obj, err := c.sandboxObj(id)
		if err != nil {
			t.Fatalf("object of %s: %v", id, err)
		}
		if obj.Spec.NodeName == "" || obj.Labels[berthv1.LabelNode] != obj.Spec.NodeName {
			t.Fatalf("%s: spec.nodeName %q, label %q", id, obj.Spec.NodeName, obj.Labels[berthv1.LabelNode])
		}
		byNode[obj.Spec.NodeName] = append(byNode[obj.Spec.NodeName], id)
		out, code, err := run(ctx, alice[(i+1)%2], id, "sh", "-c", "echo hello-$BERTH_SANDBOX_ID")
		if err != nil || code != 0 || strings.TrimSpace(out) != "hello-"+id {
			t.Errorf("%s exec through replica%d: %q exit %d, %v", id, (i+1)%2+1, out, code, err)
		}
	}
	for _, n := range c.nodes {
		local := localIDs(t, n)
		for _, id := range byNode[n.name] {
			if !local[id] {
				t.Errorf("%s bound to %s but %s does not run it", id, n.name, n.name)
			}
		}
		for id := range local {
			if !slices.Contains(byNode[n.name], id) {
				t.Errorf("%s runs %s, bound to another node", n.name, id)
			}
		}
	}
	t.Logf("placement: %s", placementSummary(byNode))
	c.kubectl("get", "nodes.berth.dev")
	c.kubectl("get", "sandboxes")
	testutil.Eventually(t, testutil.Within(30*time.Second).Every(250*time.Millisecond), func() error {
		for _, id := range ids {
			obj, err := c.sandboxObj(id)
			if err != nil {
				return err
			}
			if obj.Status.State != "running" {
				return fmt.Errorf("%s: object state %q, want running", id, obj.Status.State)
			}
		}
		return nil
	})
	// Both replicas list all 30 for alice.
	for i, a := range alice {
		list, err := a.ListAll(ctx, client.ListOptions{})
		if err != nil {
			t.Fatalf("list through replica%d: %v", i+1, err)
		}
		if len(list) != total {
			t.Errorf("replica%d lists %d sandboxes, want %d", i+1, len(list), total)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("PauseResumeFork", func(t *testing.T) { pauseResumeFork(t, c, alice, ids[0]) })
	t.Run("E2B", func(t *testing.T) { e2bThroughReplica(t, c, c.replicas[1], k.Key) })
	t.Run("E2BSDK", func(t *testing.T) { sdkThroughReplicas(t, c, k.Key) })
	t.Run("E2BSDKCommands", func(t *testing.T) { sdkCommandsThroughReplicas(t, c, k.Key) })
	t.Run("WarmHit", func(t *testing.T) { warmHit(t, c, alice[1]) })

	// Kill the busiest node; its sandboxes go lost within the lease period
	// (plus the replicas' one-second check), the Node says LeaseExpired.
	victim := busiest(byNode)
	vn := c.node(victim)
	lostIDs := byNode[victim]
	killed := time.Now()
	vn.kill9()
	testutil.Eventually(t, testutil.Within(leaseDuration+15*time.Second).Every(200*time.Millisecond), func() error {
		for _, id := range lostIDs {
			obj, err := c.sandboxObj(id)
			if err != nil {
				return err
			}
			if obj.Status.State != "lost" {
				return fmt.Errorf("%s on %s: state %q, want lost", id, victim, obj.Status.State)
			}
		}
		return nil
	})
	t.Logf("%d sandboxes of %s lost %s after SIGKILL (lease %s)", len(lostIDs), victim, time.Since(killed).Round(100*time.Millisecond), leaseDuration)
	c.kubectl("get", "nodes.berth.dev", "-o", "wide")
	var vobj berthv1.Node
	if err := c.kc.Get(ctx, berthv1.Nodes, ns, victim, &vobj); err != nil {
		t.Fatal(err)
	}
	if cond := kube.FindCondition(vobj.Status.Conditions, berthv1.CondNodeReady); cond == nil || cond.Status != "False" || cond.Reason != "LeaseExpired" {
		t.Errorf("%s Ready condition %+v, want False/LeaseExpired", victim, cond)
	}
	for _, id := range lostIDs[:1] {
		obj, _ := c.sandboxObj(id)
		if obj.Status.Reason != "node_lost" {
			t.Errorf("%s: reason %q, want node_lost", id, obj.Status.Reason)
		}
		sb, err := alice[0].Sandbox(id).Get(ctx)
		if err != nil || sb.State != "lost" {
			t.Errorf("GET %s through a replica: %+v, %v; want state lost", id, sb, err)
		}
		if _, _, err := run(ctx, alice[1], id, "true"); err == nil {
			t.Errorf("exec in lost %s succeeded", id)
		}
	}
	// New creates avoid the lost node.
	var after []string
	for i := range 4 {
		sb, err := alice[i%2].Create(ctx, wire.CreateRequest{Template: "tiny", CPU: 0.25, MemoryMiB: 64})
		if err != nil {
			t.Fatalf("create with %s lost: %v", victim, err)
		}
		obj, err := c.sandboxObj(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if obj.Spec.NodeName == victim {
			t.Errorf("%s placed on lost node %s", sb.ID, victim)
		}
		after = append(after, sb.ID)
	}

	// The lost node comes back: it stops and deletes its lost sandboxes
	// (never resurrects them) and nothing runs twice.
	vn.start()
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		local := localIDs(t, vn)
		var still []string
		for _, id := range lostIDs {
			if local[id] {
				still = append(still, id)
			}
		}
		if len(still) > 0 {
			return fmt.Errorf("%s still has %d lost sandboxes locally: %v", victim, len(still), still)
		}
		containers, err := vn.runtimeContainers()
		if err != nil {
			return err
		}
		for _, id := range lostIDs {
			for _, ctr := range containers {
				if strings.Contains(ctr, id) {
					return fmt.Errorf("%s: container %s of lost %s still in runc's list", victim, ctr, id)
				}
			}
		}
		return nil
	})
	for _, id := range lostIDs {
		obj, err := c.sandboxObj(id)
		if err == nil && obj.Status.State != "lost" && obj.Status.State != "deleted" {
			t.Errorf("lost %s came back as %q", id, obj.Status.State)
		}
	}
	// Nothing runs twice: every sandbox id runs on at most one node, the
	// lost ones on none.
	seen := map[string]string{}
	for _, n := range c.nodes {
		for id := range localIDs(t, n) {
			if other, dup := seen[id]; dup {
				t.Errorf("%s runs on %s and %s", id, other, n.name)
			}
			seen[id] = n.name
			if slices.Contains(lostIDs, id) {
				t.Errorf("lost %s runs on %s", id, n.name)
			}
		}
	}
	// The node is Ready again and takes work.
	testutil.Eventually(t, testutil.Within(30*time.Second).Every(250*time.Millisecond), func() error {
		var obj berthv1.Node
		if err := c.kc.Get(ctx, berthv1.Nodes, ns, victim, &obj); err != nil {
			return err
		}
		if cond := kube.FindCondition(obj.Status.Conditions, berthv1.CondNodeReady); cond == nil || cond.Status != "True" {
			return fmt.Errorf("%s Ready %+v after restart", victim, cond)
		}
		return nil
	})

	// Delete everything through the replicas; the nodes end empty.
	all := append(append([]string{}, ids...), after...)
	for i, id := range all {
		if err := alice[i%2].Sandbox(id).Delete(ctx); err != nil && !isNotFound(err) {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		for _, n := range c.nodes {
			if l := localIDs(t, n); len(l) > 0 {
				return fmt.Errorf("%s still runs %d sandboxes", n.name, len(l))
			}
			ctrs, err := n.runtimeContainers()
			if err != nil {
				return err
			}
			if len(ctrs) > 0 {
				return fmt.Errorf("%s: runc still lists %v", n.name, ctrs)
			}
		}
		return nil
	})
	checkRBAC(t, c)
}

// pauseResumeFork drives one sandbox's lifecycle through the replicas.
func pauseResumeFork(t *testing.T, c *cluster, alice []*client.Client, id string) {
	ctx := context.Background()
	if out, code, err := run(ctx, alice[0], id, "sh", "-c", "echo kept > /tmp/mark"); err != nil || code != 0 {
		t.Fatalf("write mark: %q %d %v", out, code, err)
	}
	sb, err := alice[0].Sandbox(id).Pause(ctx, wire.PauseFreeze)
	if err != nil {
		t.Fatalf("pause through replica1: %v", err)
	}
	if sb.State != "paused" {
		t.Errorf("pause answered state %q", sb.State)
	}
	testutil.Eventually(t, testutil.Within(15*time.Second), func() error {
		obj, err := c.sandboxObj(id)
		if err != nil {
			return err
		}
		if obj.Status.State != "paused" {
			return fmt.Errorf("object state %q after pause, want paused", obj.Status.State)
		}
		return nil
	})
	if got, err := alice[1].Sandbox(id).Get(ctx); err != nil || got.State != "paused" {
		t.Errorf("GET through replica2 after pause: %+v %v", got, err)
	}
	if _, err := alice[1].Sandbox(id).Resume(ctx); err != nil {
		t.Fatalf("resume through replica2: %v", err)
	}
	if out, _, err := run(ctx, alice[1], id, "cat", "/tmp/mark"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("after resume: %q %v", out, err)
	}
	obj, err := c.sandboxObj(id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := alice[0].Sandbox(id).Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork through replica1: %v", err)
	}
	if len(res.Sandboxes) != 1 {
		t.Fatalf("fork made %d sandboxes", len(res.Sandboxes))
	}
	child := res.Sandboxes[0].ID
	t.Cleanup(func() { _ = alice[0].Sandbox(child).Delete(context.Background()) })
	cobj, err := c.sandboxObj(child)
	if err != nil {
		t.Fatalf("fork child %s has no object: %v", child, err)
	}
	if cobj.Spec.NodeName != obj.Spec.NodeName {
		t.Errorf("child %s bound to %q, parent on %q", child, cobj.Spec.NodeName, obj.Spec.NodeName)
	}
	if !localIDs(t, c.node(obj.Spec.NodeName))[child] {
		t.Errorf("child %s does not run on %s", child, obj.Spec.NodeName)
	}
	if out, _, err := run(ctx, alice[1], child, "cat", "/tmp/mark"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("child reads %q, %v; want the parent's file", out, err)
	}
	if err := alice[1].Sandbox(child).Delete(ctx); err != nil {
		t.Errorf("delete child: %v", err)
	}
}

// localIDs are the sandboxes a node runs (its own store, not deleted), as
// its local admin sees them.
func localIDs(t *testing.T, n *node) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if !n.running() {
		t.Fatalf("%s is not running", n.name)
	}
	list, err := n.client(n.key).ListAll(context.Background(), client.ListOptions{Owner: "alice"})
	if err != nil {
		t.Fatalf("%s local list: %v", n.name, err)
	}
	for _, sb := range list {
		if sb.State != "deleted" {
			out[sb.ID] = true
		}
	}
	return out
}

func busiest(byNode map[string][]string) string {
	best := ""
	for n, ids := range byNode {
		if best == "" || len(ids) > len(byNode[best]) || (len(ids) == len(byNode[best]) && n < best) {
			best = n
		}
	}
	return best
}

func placementSummary(byNode map[string][]string) string {
	var names []string
	for n := range byNode {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", n, len(byNode[n])))
	}
	return strings.Join(parts, " ")
}

func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.StatusCode == http.StatusNotFound
}

// checkRBAC: nothing the processes did was refused by deploy/'s Roles
// (a node marks a Sandbox object deleted, a replica removes it).
func checkRBAC(t *testing.T, c *cluster) {
	for _, p := range c.procs() {
		for _, line := range strings.Split(p.log.String(), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("%s was refused by RBAC: %s", p.name, line)
			}
		}
	}
}

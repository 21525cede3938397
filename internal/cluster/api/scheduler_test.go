package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

// kubectlApply applies yaml to c's namespace with the real kubectl, as a
// person would (client-side apply, spec only).
func (c *cluster) kubectlApply(yaml string) {
	c.t.Helper()
	kubectl := srv.Kubectl()
	if kubectl == "" {
		c.t.Fatal("kubectl is not among the test assets (scripts/kube-assets.sh)")
	}
	p := filepath.Join(c.t.TempDir(), "sbx.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		c.t.Fatal(err)
	}
	out, err := exec.CommandContext(c.t.Context(), kubectl, "--kubeconfig", srv.Kubeconfig(c.t, "", c.ns), "-n", c.ns,
		"apply", "-f", p).CombinedOutput()
	if err != nil {
		c.t.Fatalf("kubectl apply: %v: %s", err, out)
	}
}

// sandboxYAML is a Sandbox object as a person writes it: spec only.
func sandboxYAML(name, template string, memMiB int) string {
	return fmt.Sprintf(`apiVersion: berth.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
spec:
  owner: alice
  template: %s
  resources:
    memoryMiB: %d
---
`, name, template, memMiB)
}

func (c *cluster) object(name string) *berthv1.Sandbox {
	c.t.Helper()
	var o berthv1.Sandbox
	if err := srv.Client.Get(c.t.Context(), berthv1.Sandboxes, c.ns, name, &o); err != nil {
		c.t.Fatalf("get sandbox %s: %v", name, err)
	}
	return &o
}

// bindLog counts the scheduler's "sandbox scheduled" lines per sandbox.
type bindLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (b *bindLog) Enabled(context.Context, slog.Level) bool { return true }
func (b *bindLog) WithAttrs([]slog.Attr) slog.Handler       { return b }
func (b *bindLog) WithGroup(string) slog.Handler            { return b }
func (b *bindLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sandbox scheduled" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "sandbox_id" {
			b.mu.Lock()
			b.n[a.Value.String()]++
			b.mu.Unlock()
		}
		return true
	})
	return nil
}

// Two replicas' schedulers racing over ten kubectl-applied objects bind
// each exactly once: counted in both replicas' logs and in the objects'
// own history (a watch sees nodeName set once and never changed).
func TestSchedulerRaceBindsOnce(t *testing.T) {
	c := newCluster(t)
	c.node("n1", 16384, createdHandler)
	c.node("n2", 16384, createdHandler)
	ctx := t.Context()
	var l berthv1.SandboxList
	if err := srv.Client.List(ctx, berthv1.Sandboxes, c.ns, kube.ListOptions{}, &l); err != nil {
		t.Fatal(err)
	}
	w, err := srv.Client.Watch(ctx, berthv1.Sandboxes, c.ns, kube.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	history := map[string][]string{} // object → nodeName after each event
	var hmu sync.Mutex
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			ev, err := w.Next()
			if err != nil {
				return
			}
			var o berthv1.Sandbox
			if json.Unmarshal(ev.Object, &o) == nil {
				hmu.Lock()
				history[o.Name] = append(history[o.Name], o.Spec.NodeName)
				hmu.Unlock()
			}
		}
	}()

	var yaml strings.Builder
	for i := range 10 {
		yaml.WriteString(sandboxYAML(fmt.Sprintf("race%d", i), "default", 512))
	}
	c.kubectlApply(yaml.String())

	logs := &bindLog{n: map[string]int{}}
	reps := []*Replica{c.rep}
	r2, _ := c.replica(func(cfg *Config) { cfg.Log = slog.New(logs) })
	c.rep.log = slog.New(logs)
	reps = append(reps, r2)
	var wg sync.WaitGroup
	for _, r := range reps {
		for range 2 { // two passes at once per replica, too
			wg.Go(func() {
				for range 3 {
					if err := r.Schedule(ctx); err != nil {
						t.Errorf("schedule: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()

	for i := range 10 {
		name := fmt.Sprintf("race%d", i)
		o := c.object(name)
		if o.Spec.NodeName == "" || o.Labels[berthv1.LabelNode] != o.Spec.NodeName {
			t.Errorf("%s: nodeName %q label %q", name, o.Spec.NodeName, o.Labels[berthv1.LabelNode])
		}
		if cnd := kube.FindCondition(o.Status.Conditions, berthv1.CondScheduled); cnd == nil || cnd.Status != "True" {
			t.Errorf("%s: Scheduled %+v", name, cnd)
		}
		if o.Status.State != berthv1.StatePending || o.Status.Timings.BoundAt == nil || o.Spec.ExpiresAt == nil {
			t.Errorf("%s: state %q boundAt %v expiresAt %v (a bound kubectl object stays pending until its node makes it)",
				name, o.Status.State, o.Status.Timings.BoundAt, o.Spec.ExpiresAt)
		}
	}
	// Let the watch catch up with the last write, then read the history.
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		hmu.Lock()
		defer hmu.Unlock()
		for i := range 10 {
			h := history[fmt.Sprintf("race%d", i)]
			if len(h) == 0 || h[len(h)-1] == "" {
				return fmt.Errorf("race%d: history %q", i, h)
			}
		}
		return nil
	})
	w.Close()
	<-watched
	total := 0
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for i := range 10 {
		name := fmt.Sprintf("race%d", i)
		changes := 0
		prev := ""
		for _, n := range history[name] {
			if n != prev {
				changes++
			}
			prev = n
		}
		if changes != 1 {
			t.Errorf("%s: nodeName history %q: want set exactly once", name, history[name])
		}
		if logs.n[name] != 1 {
			t.Errorf("%s: bound %d times in the replicas' logs, want 1", name, logs.n[name])
		}
		total += logs.n[name]
	}
	t.Logf("10 objects, 2 replicas × 2 concurrent schedulers × 3 passes: %d binds", total)
}

// What nothing fits is told why once (Scheduled=False, Unschedulable,
// placement's message), and passes that find the same answer write
// nothing; bad specs fail with the field named; an expired one fails.
func TestSchedulerUnschedulableAndInvalid(t *testing.T) {
	c := newCluster(t)
	c.node("n1", 2048, createdHandler)
	ctx := t.Context()
	c.kubectlApply(sandboxYAML("big", "default", 8192) + sandboxYAML("notpl", "nosuch", 256) +
		sandboxYAML("bad-name", "default", 256) + `apiVersion: berth.dev/v1alpha1
kind: Sandbox
metadata:
  name: pinned
spec:
  owner: alice
  template: default
  nodeName: n1
---
apiVersion: berth.dev/v1alpha1
kind: Sandbox
metadata:
  name: badann
  annotations:
    berth.dev/sandbox: "{not json"
spec:
  owner: alice
  template: default
---
apiVersion: berth.dev/v1alpha1
kind: Sandbox
metadata:
  name: old
spec:
  owner: alice
  template: default
  expiresAt: "2020-01-01T00:00:00Z"
`)
	// Read back as the store reads a person's object: pending, created
	// when the API server created it.
	sb, err := c.st.GetSandbox(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != statePending || sb.CreatedAt.IsZero() || sb.Owner != "alice" || sb.Resources.MemoryMiB != 8192 || sb.Version != 0 {
		t.Fatalf("a kubectl object as the store reads it: %+v", sb)
	}
	if err := c.rep.Schedule(ctx); err != nil {
		t.Fatal(err)
	}
	big := c.object("big")
	cnd := kube.FindCondition(big.Status.Conditions, berthv1.CondScheduled)
	if cnd == nil || cnd.Status != "False" || cnd.Reason != "Unschedulable" || !strings.Contains(cnd.Message, "memory") ||
		big.Status.State != berthv1.StatePending || big.Spec.NodeName != "" {
		t.Fatalf("big after a pass: state %q node %q Scheduled %+v", big.Status.State, big.Spec.NodeName, cnd)
	}
	t.Logf("big: Scheduled=False %s: %s", cnd.Reason, cnd.Message)
	rv := big.ResourceVersion
	for range 3 {
		if err := c.rep.Schedule(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.object("big").ResourceVersion; got != rv {
		t.Fatalf("big's resourceVersion went %s → %s over passes that found the same answer", rv, got)
	}

	for _, tc := range []struct{ name, reason, field string }{
		{"notpl", ReasonInvalidSpec, "spec.template"},
		{"bad-name", ReasonInvalidSpec, "metadata.name"},
		{"badann", ReasonInvalidSpec, "metadata.annotations"},
		{"pinned", ReasonInvalidSpec, "spec.nodeName"},
		{"old", ReasonExpired, "expired"},
	} {
		o := c.object(tc.name)
		ready := kube.FindCondition(o.Status.Conditions, berthv1.CondReady)
		if o.Status.State != string(sandbox.Failed) || o.Status.Reason != tc.reason || ready == nil || !strings.Contains(ready.Message, tc.field) {
			t.Errorf("%s: state %q reason %q Ready %+v, want failed %s naming %s", tc.name, o.Status.State, o.Status.Reason, ready, tc.reason, tc.field)
		}
	}
	if sb, err := c.st.GetSandbox(ctx, "notpl"); err != nil || !strings.Contains(sb.Message, `spec.template: unknown template "nosuch"`) {
		t.Errorf("notpl's message: %v %+v", err, sb)
	}

	// The example in deploy/examples applies as it is and is bound (it
	// fits: 512 MiB on n1).
	ex, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "examples", "sandbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c.kubectlApply(string(ex))
	if err := c.rep.Schedule(ctx); err != nil {
		t.Fatal(err)
	}
	if o := c.object("example"); o.Spec.NodeName != "n1" || o.Spec.DurationClass != "short" || o.Spec.Labels["task"] != "example" {
		t.Fatalf("deploy/examples/sandbox.yaml: node %q spec %+v", o.Spec.NodeName, o.Spec)
	}

	// Room appears (a bigger node): the next pass binds it, Scheduled=True.
	c.node("n2", 16384, createdHandler)
	if err := c.rep.Schedule(ctx); err != nil {
		t.Fatal(err)
	}
	big = c.object("big")
	cnd = kube.FindCondition(big.Status.Conditions, berthv1.CondScheduled)
	if big.Spec.NodeName != "n2" || cnd == nil || cnd.Status != "True" {
		t.Fatalf("big once n2 joined: node %q Scheduled %+v", big.Spec.NodeName, cnd)
	}
}

// With --queue-wait a create that fits nowhere waits as a pending object
// and is forwarded to its node once a delete frees room; one that waits
// out the queue gets the 429 naming the resource and leaves no object.
func TestQueueWaitFakeNode(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	n := c.node("n1", 1024, createdHandler)
	rep, url := c.replica(func(cfg *Config) { cfg.QueueWait = 30 * time.Second })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { rep.RunScheduler(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// A filler takes the node's memory.
	first := c.create(`{"memory_mib":1024}`)
	type answer struct {
		st   int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		st, _, body := c.do("POST", url+"/v1/sandboxes", c.key, `{"memory_mib":512,"env":{"A":"b"}}`)
		got <- answer{st, body}
	}()
	var queued *sandbox.Sandbox
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		sbs, err := c.st.SandboxesOnNode(ctx, "n1")
		if err != nil {
			return err
		}
		all, _, err := c.st.ListSandboxes(ctx, storeFilterPending())
		if err != nil {
			return err
		}
		if len(sbs) != 1 || len(all) != 1 || all[0].Reason != ReasonQueued {
			return fmt.Errorf("on n1 %d, pending %d", len(sbs), len(all))
		}
		queued = all[0]
		return nil
	})
	o := c.object(queued.ID)
	if cnd := kube.FindCondition(o.Status.Conditions, berthv1.CondScheduled); cnd == nil || cnd.Status != "False" || !strings.Contains(cnd.Message, "memory") {
		t.Fatalf("the queued object's Scheduled: %+v", cnd)
	}
	select {
	case a := <-got:
		t.Fatalf("the queued create answered before room was made: %d %s", a.st, a.body)
	default:
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/sandboxes/"+first.ID, c.key, ""); st/100 != 2 {
		t.Fatalf("delete the filler: %d %s", st, body)
	}
	var a answer
	select {
	case a = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the queued create did not answer after the delete")
	}
	if a.st != 201 || !strings.Contains(a.body, queued.ID) {
		t.Fatalf("queued create: %d %s (want 201 for %s)", a.st, a.body, queued.ID)
	}
	var forwarded int
	for _, rq := range n.requests() {
		if rq.method == "POST" && rq.sandboxID == queued.ID {
			forwarded++
			if !strings.Contains(rq.body, `"env":{"A":"b"}`) {
				t.Errorf("forwarded body lost the request: %s", rq.body)
			}
		}
	}
	if forwarded != 1 {
		t.Fatalf("node saw the queued create %d times, want 1", forwarded)
	}
	sb, err := c.st.GetSandbox(ctx, queued.ID)
	if err != nil || sb.Attrs.Cluster.Node != "n1" || sb.State != sandbox.Running {
		t.Fatalf("queued object after its create: %v %+v", err, sb)
	}

	// E2B's create queues the same way and answers E2B's create body.
	filler := c.create(`{"memory_mib":512}`)
	e2b := make(chan answer, 1)
	go func() {
		st, _, body := c.do("POST", url+"/v2/sandboxes", "", `{"templateID":"base"}`, "X-API-KEY", c.key)
		e2b <- answer{st, body}
	}()
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		all, _, err := c.st.ListSandboxes(ctx, storeFilterPending())
		if err != nil || len(all) != 1 {
			return fmt.Errorf("pending: %v %d", err, len(all))
		}
		return nil
	})
	if st, _, body := c.do("DELETE", c.url+"/v1/sandboxes/"+filler.ID, c.key, ""); st/100 != 2 {
		t.Fatalf("delete the second filler: %d %s", st, body)
	}
	select {
	case a = <-e2b:
	case <-time.After(20 * time.Second):
		t.Fatal("the queued E2B create did not answer after the delete")
	}
	if a.st != 201 || !strings.Contains(a.body, `"sandboxID"`) || !strings.Contains(a.body, `"envdAccessToken"`) {
		t.Fatalf("queued E2B create: %d %s", a.st, a.body)
	}

	// A queue that is never freed: 429 naming memory, the object gone.
	_, url2 := c.replica(func(cfg *Config) { cfg.QueueWait = 1500 * time.Millisecond })
	st, _, body := c.do("POST", url2+"/v1/sandboxes", c.key, `{"memory_mib":900}`)
	if st != 429 || !strings.Contains(body, "memory") || !strings.Contains(body, "queue") {
		t.Fatalf("queue timeout: %d %s", st, body)
	}
	if all, _, err := c.st.ListSandboxes(ctx, storeFilterPending()); err != nil || len(all) != 0 {
		t.Fatalf("pending objects after the timeout: %v %d", err, len(all))
	}
	// Without --queue-wait: refused at once, as before.
	if st, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":900}`); st != 429 || strings.Contains(body, "queue") {
		t.Fatalf("no queue: %d %s", st, body)
	}
}

func storeFilterPending() store.SandboxFilter {
	return store.SandboxFilter{States: []sandbox.State{statePending}}
}

// A pending object bound to a node that is lost before it made the
// sandbox never ran: it is unbound and placed on another node (a running
// one would be lost for good, nodeloss.go).
func TestSchedulerRebindsFromLostNode(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	c.node("n1", 16384, createdHandler)
	c.kubectlApply(sandboxYAML("stray", "default", 512))
	if err := c.rep.Schedule(ctx); err != nil {
		t.Fatal(err)
	}
	if o := c.object("stray"); o.Spec.NodeName != "n1" {
		t.Fatalf("stray bound to %q, want n1", o.Spec.NodeName)
	}
	c.node("n2", 16384, createdHandler)
	c.renew("n1", time.Now().Add(-time.Minute), 40)
	if err := c.rep.DetectLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.rep.Schedule(ctx); err != nil {
		t.Fatal(err)
	}
	o := c.object("stray")
	if o.Spec.NodeName != "n2" || o.Labels[berthv1.LabelNode] != "n2" || o.Status.State != berthv1.StatePending {
		t.Fatalf("stray after n1 was lost: node %q label %q state %q", o.Spec.NodeName, o.Labels[berthv1.LabelNode], o.Status.State)
	}
	if sbs, err := c.st.SandboxesOnNode(ctx, "n1"); err != nil || len(sbs) != 0 {
		t.Fatalf("n1 still has %d objects: %v", len(sbs), err)
	}
}

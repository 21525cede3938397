package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

// A node whose Lease expired is marked not ready, its sandboxes lost
// (with their events), requests for them answer 410, and creates avoid it.
func TestNodeLoss(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	ctx := t.Context()
	gone := c.node("gone", 16384, createdHandler)
	live := c.node("live", 16384, createdHandler)
	var ids []string
	for range 2 {
		_, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":2048}`)
		var sb wire.Sandbox
		_ = json.Unmarshal([]byte(body), &sb)
		ids = append(ids, sb.ID)
	}
	onGone := 0
	for _, id := range ids {
		sb, err := c.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Attrs.Cluster.Node == "gone" {
			onGone++
		}
	}
	if onGone != 2 { // packed: the second goes where the first is
		t.Fatalf("%d of 2 sandboxes on node gone; want both", onGone)
	}
	_ = gone
	c.renew("gone", time.Now().Add(-time.Minute), 40) // its agent went silent a minute ago
	rep2, _ := c.replica()
	// Two replicas run the detector at once: the writes are conditional, the outcome one.
	var wg sync.WaitGroup
	for _, r := range []*Replica{c.rep, rep2} {
		wg.Go(func() {
			if err := r.DetectLoss(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// One more pass settles whatever a conflict between the two left.
	if err := c.rep.DetectLoss(ctx); err != nil {
		t.Fatal(err)
	}
	var gn berthv1.Node
	if err := srv.Client.Get(ctx, berthv1.Nodes, c.ns, "gone", &gn); err != nil {
		t.Fatal(err)
	}
	if cond := kube.FindCondition(gn.Status.Conditions, berthv1.CondNodeReady); cond == nil || cond.Status != "False" || cond.Reason != ReasonLeaseExpired {
		t.Fatalf("node gone's Ready condition: %+v", cond)
	}
	for _, id := range ids {
		sb, err := c.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != sandbox.Lost || sb.Reason != ReasonNodeLost || sb.Attrs.Cluster.LostAt.IsZero() {
			t.Fatalf("sandbox %s: state %s reason %q lost at %v", id, sb.State, sb.Reason, sb.Attrs.Cluster.LostAt)
		}
		evs, err := c.st.ListEvents(ctx, store.EventFilter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		lostEvents := 0
		for _, e := range evs {
			if e.To == sandbox.Lost && e.Reason == ReasonNodeLost {
				lostEvents++
			}
		}
		if lostEvents != 1 {
			t.Fatalf("sandbox %s has %d lost events, want 1: %+v", id, lostEvents, evs)
		}
	}
	st, _, body := c.do("POST", c.url+"/v1/sandboxes/"+ids[0]+"/exec", c.key, `{}`)
	if st != 410 || !strings.Contains(body, "node_lost") {
		t.Fatalf("exec on a lost sandbox: %d %s", st, body)
	}
	st, _, body = c.do("GET", c.url+"/v1/sandboxes/"+ids[0]+"/events", c.key, "")
	if st != 200 || !strings.Contains(body, `"reason": "node_lost"`) || !strings.Contains(body, `"to": "lost"`) {
		t.Fatalf("events of a lost sandbox: %d %s", st, body)
	}
	st, _, body = c.do("POST", c.url+"/sandboxes/"+ids[0]+"/pause", "", ``, "X-API-KEY", c.key)
	if st != 410 || !strings.Contains(body, `"code":410`) {
		t.Fatalf("E2B pause on a lost sandbox: %d %s", st, body)
	}
	// New work goes to the live node.
	before := len(gone.requests())
	st, _, body = c.do("POST", c.url+"/v1/sandboxes", c.key, `{"memory_mib":2048}`)
	if st != 201 || len(gone.requests()) != before || len(live.requests()) != 1 {
		t.Fatalf("create after the loss: %d %s; gone saw %d new, live %d", st, body, len(gone.requests())-before, len(live.requests()))
	}
	// A lost sandbox can be deleted without its node.
	if st, _, body := c.do("DELETE", c.url+"/v1/sandboxes/"+ids[1], c.key, ""); st != 204 {
		t.Fatalf("delete lost: %d %s", st, body)
	}
	if _, err := c.st.GetSandbox(ctx, ids[1]); !errs.Is(err, errs.NotFound) {
		t.Fatalf("lost sandbox's object after delete: %v", err)
	}
	// The node coming back does not resurrect anything.
	c.renew("gone", time.Now(), 40)
	if err := c.rep.DetectLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if sb, _ := c.st.GetSandbox(ctx, ids[0]); sb == nil || sb.State != sandbox.Lost {
		t.Fatalf("after the node returned: %+v", sb)
	}
}

// Run's loop does the same by itself, and stops with its context.
func TestRunLoop(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	c.node("n", 16384, createdHandler)
	_, _, body := c.do("POST", c.url+"/v1/sandboxes", c.key, `{}`)
	var sb wire.Sandbox
	_ = json.Unmarshal([]byte(body), &sb)
	c.renew("n", time.Now().Add(-3*time.Second), 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { c.rep.Run(ctx); close(done) }()
	testutil.Eventually(t, testutil.Within(15*time.Second), func() error {
		got, err := c.st.GetSandbox(t.Context(), sb.ID)
		if err != nil {
			return err
		}
		if got.State != sandbox.Lost {
			return fmt.Errorf("sandbox is %s", got.State)
		}
		return nil
	})
	cancel()
	<-done
}

// An operator deletes a Node object (kubectl delete bnode X): its Lease
// stays. While the Lease is fresh the agent lives and writes its Node
// again, so nothing of its sandboxes changes; once the Lease has expired
// its sandboxes are lost (node_lost, one event each), as a lapsed Node's
// are, and a delete of a lost sandbox works without the node.
func TestNodeObjectDeleted(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	ctx := t.Context()
	c.node("doomed", 16384, createdHandler)
	sb := c.create(`{"memory_mib":2048}`)
	if got, err := c.st.GetSandbox(ctx, sb.ID); err != nil || got.Attrs.Cluster.Node != "doomed" {
		t.Fatalf("sandbox %s: %+v, %v; want bound to doomed", sb.ID, got, err)
	}
	other := c.create(`{"memory_mib":2048}`) // a second one, deleted while lost below
	before := map[string]sandbox.State{}
	for _, id := range []string{sb.ID, other.ID} {
		got, err := c.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = got.State
	}
	if err := srv.Client.Delete(ctx, berthv1.Nodes, c.ns, "doomed", kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.rep.DetectLoss(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, other.ID} {
		if got, err := c.st.GetSandbox(ctx, id); err != nil || got.State != before[id] {
			t.Fatalf("sandbox %s with its Node deleted and its Lease fresh: %+v, %v; want it %s still", id, got, err, before[id])
		}
	}

	c.renew("doomed", time.Now().Add(-time.Minute), 40) // the agent is gone too
	if err := c.rep.DetectLoss(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.rep.DetectLoss(ctx); err != nil { // a second pass writes nothing more
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, other.ID} {
		got, err := c.st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != sandbox.Lost || got.Reason != ReasonNodeLost || got.Attrs.Cluster.LostAt.IsZero() ||
			!strings.Contains(got.Message, "no Node object") {
			t.Fatalf("sandbox %s of a deleted, expired node: state %s reason %q message %q", id, got.State, got.Reason, got.Message)
		}
		evs, err := c.st.ListEvents(ctx, store.EventFilter{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.To == sandbox.Lost && e.Reason == ReasonNodeLost {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("sandbox %s has %d lost events, want 1: %+v", id, n, evs)
		}
	}
	// No Node object was made up for it.
	var n berthv1.Node
	if err := srv.Client.Get(ctx, berthv1.Nodes, c.ns, "doomed", &n); !errs.Is(err, errs.NotFound) {
		t.Fatalf("Node doomed after the pass: %v, want not found", err)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/sandboxes/"+other.ID, c.key, ""); st != 204 {
		t.Fatalf("delete a lost sandbox of a deleted node: %d %s", st, body)
	}
	if st, _, body := c.do("POST", c.url+"/v1/sandboxes/"+sb.ID+"/exec", c.key, `{}`); st != 410 || !strings.Contains(body, "node_lost") {
		t.Fatalf("exec on it: %d %s", st, body)
	}
}

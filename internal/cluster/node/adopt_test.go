package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestNodeAdoptionGrace is the replica's crash window on a warm hit: a
// signed create that names no id claims a warm member (its own id), bound
// to this node and tagged AdoptFrom; the object comes from the replica
// only after the answer. One whose object is written (as a live replica
// does) is adopted and stays; one with none (the replica died in between)
// is kept for the adoption grace, then deleted as never adopted; so is a
// fork's child made through a replica that never recorded it.
func TestNodeAdoptionGrace(t *testing.T) {
	const grace = 6 * time.Second
	h := startHostWith(t, hostOpts{resync: 500 * time.Millisecond, adoptGrace: grace})
	ctx := t.Context()
	if _, err := h.d.Pools().Set(ctx, pool.Spec{Template: "tiny", Size: 2}); err != nil {
		t.Fatal(err)
	}
	// The pool goes first at the end, and its members with it: the host's
	// teardown deletes what it lists, and a pool would refill behind it.
	t.Cleanup(func() {
		if err := h.d.Pools().Remove(context.Background(), "tiny"); err != nil {
			t.Errorf("remove the pool: %v", err)
		}
		testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
			ms, _, err := h.d.Store().ListSandboxes(context.Background(), store.SandboxFilter{Owner: pool.Owner})
			if err == nil && len(ms) > 0 {
				err = fmt.Errorf("%d pool members left", len(ms))
			}
			return err
		})
	})
	testutil.Eventually(t, testutil.Within(90*time.Second), func() error {
		st, err := h.d.Pools().List(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			if s.Template == "tiny" && s.Ready >= 2 {
				return nil
			}
		}
		return fmt.Errorf("pool not ready: %+v", st)
	})
	hc := &http.Client{Transport: peer.Transport(h.id.SHA256), Timeout: 60 * time.Second}
	post := func(path string, body any) wire.Sandbox {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, "POST", h.peerURL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		peer.Sign(req, h.token, peer.Principal{Owner: "erin"}) // no peer.HeaderSandboxID: a warm hit
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, out)
		}
		var sb wire.Sandbox
		if path == "/v1/sandboxes" {
			err = json.Unmarshal(out, &sb)
		} else {
			var fr wire.ForkResult
			if err = json.Unmarshal(out, &fr); err == nil && len(fr.Sandboxes) == 1 {
				sb = fr.Sandboxes[0]
			}
		}
		if err != nil || !sandbox.ValidID(sb.ID) {
			t.Fatalf("POST %s: answer %s: %v", path, out, err)
		}
		return sb
	}
	tagged := func(id string) *sandbox.Sandbox {
		t.Helper()
		sb, err := h.d.Store().GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Attrs.Cluster.Node != h.name || sb.Attrs.Cluster.AdoptFrom.IsZero() {
			t.Fatalf("%s: cluster attrs %+v, want bound to %s awaiting adoption", id, sb.Attrs.Cluster, h.name)
		}
		return sb
	}

	orphan := post("/v1/sandboxes", map[string]any{"template": "tiny"})
	adopted := post("/v1/sandboxes", map[string]any{"template": "tiny"})
	for _, sb := range []wire.Sandbox{orphan, adopted} {
		if sb.Extra["claimed_from_pool"] != "tiny" || sb.Owner != "erin" || sb.State != "running" {
			t.Fatalf("no-id signed create: %+v, want erin's, running, claimed from tiny's pool", sb)
		}
	}
	orphanRow := tagged(orphan.ID)
	tagged(adopted.ID)

	// What a live replica does with the answer: the object, bound here.
	now := time.Now().UTC()
	obj := &sandbox.Sandbox{ID: adopted.ID, Owner: "erin", Template: "tiny", State: sandbox.Running,
		CreatedAt: now, StartedAt: adopted.StartedAt, ExpiresAt: adopted.ExpiresAt, ExpiryAction: sandbox.ExpiryAction(adopted.ExpiryAction),
		Attrs: sandbox.Attrs{Cluster: sandbox.ClusterState{Node: h.name, BoundAt: now}}}
	if err := h.ks.CreateSandbox(ctx, obj); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		sb, err := h.d.Store().GetSandbox(ctx, adopted.ID)
		if err != nil {
			return err
		}
		if !sb.Attrs.Cluster.AdoptFrom.IsZero() {
			return fmt.Errorf("%s not adopted yet", adopted.ID)
		}
		return nil
	})

	// A fork of the adopted sandbox through a replica that never records
	// its child: the child is the cluster's (tagged), and it goes too.
	child := post("/v1/sandboxes/"+adopted.ID+"/fork", map[string]any{"count": 1})
	childRow := tagged(child.ID)

	for _, c := range []struct {
		id   string
		from time.Time
	}{{orphan.ID, orphanRow.Attrs.Cluster.AdoptFrom}, {child.ID, childRow.Attrs.Cluster.AdoptFrom}} {
		h.waitLocalGone(t, c.id)
		h.hasEvent(t, c.id, node.ReasonNeverAdopted)
		// Not before its grace: the delete's event is at least grace after it was made.
		evs, err := h.d.Store().ListEvents(ctx, store.EventFilter{SandboxID: c.id})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Type == "cluster_delete" && e.Time.Sub(c.from) < grace {
				t.Fatalf("%s deleted %s after it was made, before its %s adoption grace", c.id, e.Time.Sub(c.from), grace)
			}
		}
	}
	// The adopted one stays, mirrored, past the grace.
	if sb, err := h.d.Store().GetSandbox(ctx, adopted.ID); err != nil || sb.State != sandbox.Running {
		t.Fatalf("adopted sandbox after the grace: %+v, %v", sb, err)
	}
	if o, err := h.ks.GetSandbox(ctx, adopted.ID); err != nil || o.State != sandbox.Running {
		t.Fatalf("adopted sandbox's object: %+v, %v", o, err)
	}
}

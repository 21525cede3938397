package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/testutil"
)

// warmHit: with a WarmPool of tiny, a create through a replica claims a
// node's ready member (extra.claimed_from_pool) and its object is bound to
// that node, which runs it. The WarmPool goes at the end and the nodes
// drain their members, so the rest of the test sees no pool.
func warmHit(t *testing.T, c *cluster, alice *client.Client) {
	ctx := context.Background()
	var tpl berthv1.Template
	if err := c.kc.Get(ctx, berthv1.Templates, ns, "tiny", &tpl); err != nil || tpl.Status.Fingerprint == "" {
		t.Fatalf("template tiny: %+v, %v", tpl.Status, err)
	}
	fp := tpl.Status.Fingerprint
	wp := &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"},
		ObjectMeta: kube.ObjectMeta{Name: "tiny-warm", Namespace: ns},
		Spec:       berthv1.WarmPoolSpec{Template: "tiny", Runtime: "runc", Min: 1, Max: 1}}
	if err := c.kc.Create(ctx, berthv1.WarmPools, ns, wp, nil); err != nil {
		t.Fatal(err)
	}
	warm := func() (map[string]bool, error) {
		var nl berthv1.NodeList
		if err := c.kc.List(ctx, berthv1.Nodes, ns, kube.ListOptions{}, &nl); err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, n := range nl.Items {
			for _, p := range n.Status.WarmPools {
				if p.Fingerprint == fp && p.Ready > 0 {
					out[n.Name] = true
				}
			}
		}
		return out, nil
	}
	var ready map[string]bool
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		var err error
		// Every node keeps one (min 1), so whichever placement picks is warm.
		if ready, err = warm(); err == nil && len(ready) < len(c.nodes) {
			err = fmt.Errorf("nodes reporting a ready member of tiny: %v, want all %d", ready, len(c.nodes))
		}
		return err
	})
	sb, err := alice.Create(ctx, wire.CreateRequest{Template: "tiny"})
	if err != nil {
		t.Fatalf("create on a warm pool: %v", err)
	}
	obj, err := c.sandboxObj(sb.ID)
	if err != nil {
		t.Fatalf("object of %s: %v", sb.ID, err)
	}
	if sb.Extra["claimed_from_pool"] != "tiny" || !ready[obj.Spec.NodeName] || !localIDs(t, c.node(obj.Spec.NodeName))[sb.ID] {
		t.Errorf("warm create %s: claimed from %q, bound to %q (warm nodes %v)", sb.ID, sb.Extra["claimed_from_pool"], obj.Spec.NodeName, ready)
	}
	if err := alice.Sandbox(sb.ID).Delete(ctx); err != nil {
		t.Errorf("delete %s: %v", sb.ID, err)
	}
	if err := c.kc.Delete(ctx, berthv1.WarmPools, ns, wp.Name, kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		left, err := warm()
		if err == nil && len(left) > 0 {
			err = fmt.Errorf("nodes still report tiny members: %v", left)
		}
		return err
	})
}

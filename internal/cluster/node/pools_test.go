package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/testutil"
)

// TestTarget: PoolSize of the node's claim rate, clamped to [min, max].
func TestTarget(t *testing.T) {
	def := node.PoolSizing{}
	for _, c := range []struct {
		name     string
		rate     float64 // claims per second
		min, max int32
		want     int
	}{
		{"no claims, no min", 0, 0, 4, 0},
		{"no claims keep min", 0, 1, 4, 1},
		{"rarer than MaxIdle", 1.0 / 900, 0, 4, 0},
		{"one a minute", 1.0 / 60, 0, 4, 1},
		{"two a second", 2, 0, 8, 7}, // a = 4 erlangs: ErlangB(6, 4) = 0.117 > 0.1, ErlangB(7, 4) = 0.063
		{"capped by max", 2, 0, 3, 3},
		{"min above the rate's size", 1.0 / 60, 3, 5, 3},
		{"min above max", 0, 9, 2, 2},
		{"max 0 is the pool limit", 1000, 0, 0, pool.MaxSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := node.Target(def, c.rate, berthv1.WarmPoolSpec{Template: "x", Min: c.min, Max: c.max})
			if got != c.want {
				t.Errorf("Target(rate %g, min %d, max %d) = %d, want %d", c.rate, c.min, c.max, got, c.want)
			}
		})
	}
}

// TestWarmPoolPerNode: a WarmPool with min 1 makes the node keep one ready
// member, reported in the Node's status and the WarmPool's; five sandboxes
// bound here within a minute raise the target to PoolSize's 2.
func TestWarmPoolPerNode(t *testing.T) {
	h := startHostWith(t, hostOpts{resync: 500 * time.Millisecond,
		pools: node.PoolSizing{Tau: time.Minute, Refill: 5 * time.Second}})
	ctx := t.Context()
	wp := &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"},
		ObjectMeta: kube.ObjectMeta{Name: "tiny-pool", Namespace: h.ns},
		Spec: berthv1.WarmPoolSpec{Template: "tiny", Runtime: "runc", Min: 1, Max: 3,
			Resources: berthv1.Resources{CPUMillis: 250, MemoryMiB: 64, DiskMiB: 256, Pids: 64}}}
	if err := h.kc.Create(ctx, berthv1.WarmPools, h.ns, wp, nil); err != nil {
		t.Fatal(err)
	}
	waitReady := func(n int32) {
		t.Helper()
		testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
			var nd berthv1.Node
			if err := h.kc.Get(ctx, berthv1.Nodes, h.ns, h.name, &nd); err != nil {
				return err
			}
			var got berthv1.WarmPool
			if err := h.kc.Get(ctx, berthv1.WarmPools, h.ns, "tiny-pool", &got); err != nil {
				return err
			}
			want := []berthv1.NodeWarmPool{{Fingerprint: h.tpl.Fingerprint, Ready: n}}
			if len(nd.Status.WarmPools) != 1 || nd.Status.WarmPools[0] != want[0] {
				return fmt.Errorf("node warm pools %+v, want %+v", nd.Status.WarmPools, want)
			}
			if got.Status.Ready != n || got.Status.PerNode[h.name] != n {
				return fmt.Errorf("WarmPool status %+v, want ready %d on %s", got.Status, n, h.name)
			}
			return nil
		})
	}
	waitReady(1)

	for range 5 {
		h.bind(t, "fay")
	}
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		st, err := h.d.Pools().List(ctx)
		if err != nil {
			return err
		}
		if len(st) != 1 || st[0].Size != 2 {
			return fmt.Errorf("local pools %+v, want tiny at size 2", st)
		}
		return nil
	})
	waitReady(2)
}

package placement

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

const gib = 1024

func node(name string, usedMiB int64, run ...Running) Node {
	return Node{Name: name, Capacity: Resources{CPUMillis: 16000, MemoryMiB: 64 * gib, DiskMiB: 500 * gib},
		Allocated: Resources{MemoryMiB: usedMiB}, Runtimes: []string{"runc", "runsc"}, Ready: true, Running: run}
}

func running(id string, class Class, cpu int64, ends time.Duration) Running {
	return Running{ID: id, Owner: "o", CPUMillis: cpu, MemoryMiB: 2 * gib, Class: class, EndsAt: t0.Add(ends)}
}

func req(mem int64, class Class) Request {
	return Request{ID: "r", Resources: Resources{CPUMillis: 2000, MemoryMiB: mem, DiskMiB: 10 * gib}, Runtime: "runsc", Fingerprint: "fp", Class: class, Owner: "o"}
}

func TestPlace(t *testing.T) {
	withPool := node("warm", 40*gib, running("a", Short, 2000, time.Minute))
	withPool.Pools = []Pool{{Fingerprint: "fp", Ready: 1, Each: Resources{CPUMillis: 2000, MemoryMiB: 2 * gib, DiskMiB: 10 * gib}}}
	cached := node("cached", 40*gib, running("a", Short, 2000, time.Minute))
	cached.Cached = []string{"other", "fp"}
	full := node("full", 63*gib, running("a", Long, 2000, time.Hour))
	lost := node("lost", 0)
	lost.Lost = true
	notReady := node("notready", 0)
	notReady.Ready = false
	expired := node("expired", 0)
	expired.LeaseExpires = t0.Add(-time.Second)
	runcOnly := node("runconly", 0)
	runcOnly.Runtimes = []string{"runc"}
	zoned := node("zoned", 0)
	zoned.Labels = map[string]string{"zone": "us"}
	cpuBound := node("cpubound", 0, running("l1", Long, 8000, time.Hour), running("l2", Long, 7000, time.Hour))
	shortPacked := node("shortpacked", 0, running("s1", Short, 8000, time.Minute), running("s2", Short, 8000, time.Minute),
		running("s3", Short, 8000, time.Minute), running("s4", Short, 6000, time.Minute))
	longNode := node("longnode", 32*gib, running("l", Long, 4000, 3*time.Hour))
	shortNode := node("shortnode", 32*gib, running("s", Short, 2000, 2*time.Minute))
	fuller := node("fuller", 48*gib, running("x", Long, 2000, 3*time.Hour))
	emptier := node("emptier", 8*gib, running("y", Long, 2000, 3*time.Hour))
	empty := node("empty", 0)

	for _, tc := range []struct {
		name    string
		req     Request
		nodes   []Node
		want    string // node, or "" when nothing fits
		warm    bool
		cache   bool
		wantErr string
	}{
		{name: "warm member preferred over a cached and an empty node", req: req(2*gib, Short),
			nodes: []Node{empty, cached, withPool}, want: "warm", warm: true, cache: true},
		{name: "cached layers preferred when no member", req: req(2*gib, Short),
			nodes: []Node{node("plain", 40*gib, running("a", Short, 2000, time.Minute)), cached}, want: "cached", cache: true},
		{name: "a member of another shape is not a hit", req: req(4*gib, Short), nodes: []Node{withPool}, want: "warm"},
		{name: "memory never overcommitted", req: req(2*gib, Short), nodes: []Node{full},
			wantErr: "no node fits (of 1): memory on 1 node (needs 2048 MiB, at most 1024 MiB free)"},
		{name: "every reason counted once per node", req: func() Request {
			r := req(2*gib, Long)
			r.Capabilities = []string{"memory-checkpoint"}
			return r
		}(), nodes: []Node{lost, notReady, expired, runcOnly, full, cpuBound},
			wantErr: "no node fits (of 6): not ready on 1 node, lost on 1 node, lease expired on 1 node, runtime on 1 node, capability on 2 nodes"},
		{name: "node selector", req: func() Request {
			r := req(2*gib, Short)
			r.Labels = map[string]string{LabelSelectorPrefix + "zone": "eu", "team": "x"}
			return r
		}(), nodes: []Node{zoned}, wantErr: "no node fits (of 1): node labels on 1 node"},
		{name: "selector that matches", req: func() Request {
			r := req(2*gib, Short)
			r.Labels = map[string]string{LabelSelectorPrefix + "zone": "us"}
			return r
		}(), nodes: []Node{zoned}, want: "zoned"},
		{name: "long is charged all its CPU", req: req(2*gib, Long), nodes: []Node{cpuBound},
			wantErr: "no node fits (of 1): cpu on 1 node"},
		{name: "short is charged half: fits where a long one would not", req: req(2*gib, Short), nodes: []Node{cpuBound}, want: "cpubound"},
		{name: "interactive overcommits 4x on a node of short runs", req: req(2*gib, Interactive), nodes: []Node{shortPacked}, want: "shortpacked"},
		{name: "long goes where the node drains after it anyway", req: req(4*gib, Long), nodes: []Node{shortNode, longNode}, want: "longnode"},
		{name: "short fills a gap rather than opening an empty node", req: req(2*gib, Short), nodes: []Node{empty, longNode}, want: "longnode"},
		{name: "best fit among equals", req: req(2*gib, Short), nodes: []Node{emptier, fuller}, want: "fuller"},
		{name: "no nodes", req: req(2*gib, Short), wantErr: "no node fits: there are no nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Place(tc.req, tc.nodes, t0)
			if tc.wantErr != "" {
				var nf *NoFit
				if err == nil || err.Error() != tc.wantErr || !errors.As(err, &nf) || errs.KindOf(err) != errs.ResourceExhausted {
					t.Fatalf("Place: %v, %v; want error %q (ResourceExhausted, *NoFit)", d, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Node != tc.want || d.WarmHit != tc.warm || d.CacheHit != tc.cache {
				t.Errorf("Place = %+v; want node %s warm %v cache %v", d, tc.want, tc.warm, tc.cache)
			}
		})
	}
}

func TestValidateRequest(t *testing.T) {
	for _, tc := range []struct {
		mut   func(*Request)
		field string
	}{
		{func(r *Request) { r.Resources.CPUMillis = 0 }, "resources.cpu_millis"},
		{func(r *Request) { r.Resources.MemoryMiB = -1 }, "resources.memory_mib"},
		{func(r *Request) { r.Resources.DiskMiB = -1 }, "resources.disk_mib"},
		{func(r *Request) { r.Expected = -time.Second }, "expected_duration"},
		{func(r *Request) { r.Class = "batch" }, "expected_class"},
	} {
		r := req(gib, Short)
		tc.mut(&r)
		_, err := Place(r, []Node{node("n", 0)}, t0)
		if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
			t.Errorf("%s: %v (field %q)", tc.field, err, errs.FieldOf(err))
		}
	}
}

func TestExpect(t *testing.T) {
	p := DefaultPolicy()
	for _, tc := range []struct {
		class Class
		exp   time.Duration
		want  Class
		wantD time.Duration
	}{
		{"", 0, Long, 2 * time.Hour},
		{Short, 0, Short, 2 * time.Minute},
		{Interactive, 0, Interactive, 45 * time.Minute},
		{"", 30 * time.Second, Short, 30 * time.Second},
		{"", 15 * time.Minute, Short, 15 * time.Minute},
		{"", 16 * time.Minute, Long, 16 * time.Minute},
		{Interactive, 3 * time.Hour, Interactive, 3 * time.Hour},
	} {
		c, d := p.Expect(Request{Class: tc.class, Expected: tc.exp})
		if c != tc.want || d != tc.wantD {
			t.Errorf("Expect(%q, %s) = %q, %s; want %q, %s", tc.class, tc.exp, c, d, tc.want, tc.wantD)
		}
	}
}

// Over random fleets and request streams, Place never puts a sandbox where
// its memory or disk does not fit, never chooses a node Fits refuses, and
// refuses only when no node fits. Placed sandboxes are only ever added:
// nothing is evicted to make room.
func TestPlaceNeverOvercommitsMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	p := DefaultPolicy()
	classes := []Class{"", Short, Interactive, Long}
	for fleet := 0; fleet < 200; fleet++ {
		var nodes []Node
		for i := range 1 + rng.IntN(8) {
			n := Node{Name: string(rune('a' + i)), Capacity: Resources{CPUMillis: int64(1+rng.IntN(32)) * 1000, MemoryMiB: int64(1+rng.IntN(64)) * gib, DiskMiB: int64(10+rng.IntN(200)) * gib},
				Runtimes: []string{"runsc"}, Ready: rng.IntN(10) > 0}
			if rng.IntN(3) == 0 {
				n.Pools = []Pool{{Fingerprint: "fp", Ready: 1, Each: Resources{CPUMillis: 1000, MemoryMiB: gib, DiskMiB: gib}}}
				n.Allocated = Resources{MemoryMiB: gib, DiskMiB: gib}
				if !n.Capacity.Covers(n.Allocated) {
					n.Pools, n.Allocated = nil, Resources{}
				}
			}
			nodes = append(nodes, n)
		}
		for k := 0; k < 60; k++ {
			r := Request{ID: "r", Resources: Resources{CPUMillis: int64(1+rng.IntN(8)) * 500, MemoryMiB: int64(1+rng.IntN(16)) * 512, DiskMiB: int64(rng.IntN(20)) * gib},
				Runtime: "runsc", Fingerprint: []string{"fp", "other"}[rng.IntN(2)], Class: classes[rng.IntN(4)],
				Expected: time.Duration(rng.IntN(7200)) * time.Second}
			if rng.IntN(3) == 0 {
				r.Resources = Resources{CPUMillis: 1000, MemoryMiB: gib, DiskMiB: gib} // a pool member's shape
			}
			d, err := p.Place(r, nodes, t0)
			fitting := 0
			for i := range nodes {
				if ok, _ := p.Fits(r, &nodes[i], t0); ok {
					fitting++
				}
			}
			if err != nil {
				if fitting != 0 {
					t.Fatalf("refused %+v though %d nodes fit: %v", r, fitting, err)
				}
				continue
			}
			var n *Node
			for i := range nodes {
				if nodes[i].Name == d.Node {
					n = &nodes[i]
				}
			}
			if ok, why := p.Fits(r, n, t0); !ok {
				t.Fatalf("placed %+v on %s which does not fit: %s", r, n.Name, why)
			}
			before := len(n.Running)
			if d.WarmHit {
				n.Pools[WarmPool(r, n)].Ready--
			} else {
				n.Allocated = n.Allocated.Add(Resources{MemoryMiB: r.Resources.MemoryMiB, DiskMiB: r.Resources.DiskMiB})
			}
			n.Running = append(n.Running, Running{ID: "x", CPUMillis: r.Resources.CPUMillis, MemoryMiB: r.Resources.MemoryMiB, Class: d.Class, EndsAt: d.ExpectedEnd})
			if n.Allocated.MemoryMiB > n.Capacity.MemoryMiB || n.Allocated.DiskMiB > n.Capacity.DiskMiB {
				t.Fatalf("node %s overcommitted: %+v of %+v", n.Name, n.Allocated, n.Capacity)
			}
			if p.chargedCPU(n) > float64(n.Capacity.CPUMillis) {
				t.Fatalf("node %s CPU charged %v of %d", n.Name, p.chargedCPU(n), n.Capacity.CPUMillis)
			}
			if len(n.Running) != before+1 {
				t.Fatal("a placement removed a sandbox")
			}
		}
	}
}

func TestNoFitMessage(t *testing.T) {
	nf := &NoFit{Nodes: 5, Need: Resources{MemoryMiB: 8192}, MostFreeMiB: 4096, Counts: map[Reason]int{ReasonMemory: 3, ReasonRuntime: 1, ReasonCPU: 1}}
	want := "no node fits (of 5): runtime on 1 node, memory on 3 nodes (needs 8192 MiB, at most 4096 MiB free), cpu on 1 node"
	if diff := cmp.Diff(want, nf.Error()); diff != "" {
		t.Error(diff)
	}
	if _, err := ParseClass("expected_class", "forever"); err == nil || !strings.Contains(err.Error(), "short, interactive or long") {
		t.Errorf("ParseClass: %v", err)
	}
}

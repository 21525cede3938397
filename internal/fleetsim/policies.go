package fleetsim

import (
	"math/rand/v2"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/placement"
)

// Placer chooses a node for a request, like placement.Place.
type Placer func(req placement.Request, nodes []placement.Node, now time.Time) (placement.Decision, error)

// PolicyDef names a placement policy and makes a fresh placer of it for
// one run (a baseline's random choices come from seed).
type PolicyDef struct {
	Name string
	New  func(seed uint64) Placer
}

// Policies are the three the simulator compares: berth's Place, E2B-style
// best-of-3 least-loaded, and round-robin. All three take a node only when
// placement's own feasibility rules allow it (memory never overcommitted,
// CPU by class, runtime, readiness); they differ only in which feasible
// node they choose.
func Policies() []PolicyDef {
	return []PolicyDef{
		{Name: "berth", New: func(uint64) Placer { return placement.Place }},
		{Name: "best-of-3", New: bestOf3},
		{Name: "round-robin", New: roundRobin},
	}
}

// bestOf3 samples three feasible nodes uniformly and takes the least
// loaded: the larger of its allocated CPU share and memory share (pool
// members included). E2B's orchestrator samples among all nodes and
// retries; sampling among the feasible ones only is the kinder baseline.
func bestOf3(seed uint64) Placer {
	rng := rand.New(rand.NewPCG(seed, 3))
	pol := placement.DefaultPolicy()
	return func(req placement.Request, nodes []placement.Node, now time.Time) (placement.Decision, error) {
		feasible := feasibleNodes(pol, req, nodes, now)
		if len(feasible) == 0 {
			return pol.Place(req, nodes, now) // for the NoFit reason
		}
		best, bestLoad := -1, 0.0
		for k := 0; k < 3 && len(feasible) > 0; k++ {
			j := rng.IntN(len(feasible))
			i := feasible[j]
			feasible[j] = feasible[len(feasible)-1]
			feasible = feasible[:len(feasible)-1]
			if l := load(&nodes[i]); best < 0 || l < bestLoad {
				best, bestLoad = i, l
			}
		}
		return decide(pol, req, &nodes[best], now), nil
	}
}

// roundRobin takes the next feasible node after the last one it chose.
func roundRobin(uint64) Placer {
	next := 0
	pol := placement.DefaultPolicy()
	return func(req placement.Request, nodes []placement.Node, now time.Time) (placement.Decision, error) {
		for k := range nodes {
			i := (next + k) % len(nodes)
			if ok, _ := pol.Fits(req, &nodes[i], now); ok {
				next = i + 1
				return decide(pol, req, &nodes[i], now), nil
			}
		}
		if len(nodes) == 0 {
			return placement.Decision{}, errs.E(errs.ResourceExhausted, "no nodes")
		}
		return pol.Place(req, nodes, now)
	}
}

func feasibleNodes(pol placement.Policy, req placement.Request, nodes []placement.Node, now time.Time) []int {
	var out []int
	for i := range nodes {
		if ok, _ := pol.Fits(req, &nodes[i], now); ok {
			out = append(out, i)
		}
	}
	return out
}

func load(n *placement.Node) float64 {
	cpu := float64(n.Allocated.CPUMillis) / float64(max(n.Capacity.CPUMillis, 1))
	mem := float64(n.Allocated.MemoryMiB) / float64(max(n.Capacity.MemoryMiB, 1))
	return max(cpu, mem)
}

// decide is the decision for a chosen node: a baseline takes a warm
// member when the node it chose happens to have one.
func decide(pol placement.Policy, req placement.Request, n *placement.Node, now time.Time) placement.Decision {
	class, exp := pol.Expect(req)
	d := placement.Decision{Node: n.Name, Class: class, Expected: exp, ExpectedEnd: now.Add(exp)}
	d.WarmHit = placement.WarmPool(req, n) >= 0
	for _, fp := range n.Cached {
		if fp == req.Fingerprint {
			d.CacheHit = true
		}
	}
	d.CacheHit = d.CacheHit || d.WarmHit
	return d
}

package fleetsim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Result is one policy's figures on one trace. Shares are percentages;
// GiB·h figures are per simulated day. docs/CLUSTER.md defines each.
type Result struct {
	Policy string `json:"policy"`
	Nodes  int    `json:"nodes"`
	Tasks  int    `json:"tasks"`
	// StrandedGiBh (the headline): while some request waits for a slot,
	// the free memory on nodes that cannot take the median waiting request
	// (by memory) even with their pool members reclaimed, integrated over
	// that time, GiB·h per day.
	StrandedGiBh float64 `json:"stranded_gib_h_per_day"`
	// FragmentedPct: at all times, the free memory on nodes that cannot take
	// a long task of the mix (its largest shape) even with their pool
	// members reclaimed, time-averaged, as a share of the fleet's memory.
	FragmentedPct   float64 `json:"fragmented_pct"`
	ColdStartPct    float64 `json:"cold_start_pct"`
	LayerFetchPct   float64 `json:"layer_fetch_pct"`
	WaitedPct       float64 `json:"waited_pct"`
	WaitP50S        float64 `json:"wait_p50_s"`
	WaitP99S        float64 `json:"wait_p99_s"`
	MemoryUsedPct   float64 `json:"memory_used_pct"`
	BusyNodes       float64 `json:"busy_nodes"` // mean nodes with a sandbox running
	PoolIdleGiBh    float64 `json:"pool_idle_gib_h_per_day"`
	SessionIdleGiBh float64 `json:"session_idle_gib_h_per_day"`
	// NodesForSLO: the fewest nodes at which the p99 wait is within the SLO
	// (0: not searched; -1: not within 4× --nodes).
	NodesForSLO int `json:"nodes_for_slo"`
}

// Report is a whole run.
type Report struct {
	Config  Config   `json:"config"`
	Results []Result `json:"results"`
	// StrandedLessPct: how much less berth strands than best-of-3 (StrandedGiBh), in percent.
	StrandedLessPct float64 `json:"stranded_less_than_best_of_3_pct"`
}

// Run simulates the configured trace under every policy.
func Run(cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	trace := Trace(cfg.Seed, cfg.Mix, cfg.Days, cfg.TasksPerDay)
	rep := Report{Config: cfg}
	for _, p := range Policies() {
		r := simulate(cfg, trace, p, cfg.Seed, cfg.Nodes)
		r.Policy = p.Name
		if cfg.SizeNodes {
			r.NodesForSLO = nodesFor(cfg, trace, p)
		}
		rep.Results = append(rep.Results, r)
	}
	if b, e := rep.Results[0], rep.Results[1]; e.StrandedGiBh > 0 {
		rep.StrandedLessPct = round(100*(e.StrandedGiBh-b.StrandedGiBh)/e.StrandedGiBh, 1)
	}
	return rep, nil
}

// nodesFor finds the fewest nodes at which the policy's p99 wait is within
// the SLO, by bisection (more nodes never make the wait worse in this model
// to the precision that matters; the search takes the first passing count).
func nodesFor(cfg Config, trace []Task, p PolicyDef) int {
	ok := func(n int) bool {
		r := simulate(cfg, trace, p, cfg.Seed, n)
		return r.WaitP99S <= cfg.WaitSLO.Seconds()
	}
	hi := cfg.Nodes
	for !ok(hi) {
		if hi >= 4*cfg.Nodes {
			return -1
		}
		hi *= 2
	}
	// Step down from a passing count until one fails (cheaper than
	// bisecting from zero nodes: a badly overloaded run is the slowest),
	// then bisect.
	step := max(1, hi/8)
	lo := max(hi-step, 0)
	for lo > 0 && ok(lo) {
		hi, lo = lo, max(lo-step, 0)
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func (s *sim) result(n int, span time.Duration) Result {
	secs := span.Seconds()
	days := span.Hours() / 24
	fleet := float64(n) * float64(s.cfg.Node.MemoryMiB)
	gibh := func(mibs float64) float64 { return round(mibs/1024/3600/days, 1) }
	r := Result{Nodes: n, Tasks: s.placed}
	r.FragmentedPct = round(100*s.stranded/secs/fleet, 2)
	r.StrandedGiBh = gibh(s.strandedWaiting)
	r.BusyNodes = round(s.busy/secs, 1)
	r.MemoryUsedPct = round(100*s.used/secs/fleet, 1)
	r.PoolIdleGiBh = gibh(s.poolIdle)
	r.SessionIdleGiBh = gibh(s.sessionIdle)
	if s.placed > 0 {
		r.ColdStartPct = round(100*float64(s.cold)/float64(s.placed), 1)
		r.LayerFetchPct = round(100*float64(s.fetches)/float64(s.placed), 1)
		w := slices.Clone(s.waits)
		slices.Sort(w)
		waited := 0
		for _, d := range w {
			if d > 0 {
				waited++
			}
		}
		r.WaitedPct = round(100*float64(waited)/float64(len(w)), 2)
		r.WaitP50S = round(quantile(w, 0.50).Seconds(), 1)
		r.WaitP99S = round(quantile(w, 0.99).Seconds(), 1)
	}
	return r
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// Markdown writes the report as a table with its command line.
func (r Report) Markdown(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "`berth sim --seed %d --nodes %d --node-cpu %g --node-memory %d --days %g --tasks-per-day %d`: %d nodes of %g CPU, %d GiB, %d GiB disk; %d tasks over %g days; pools sized for a %g%% hit rate.\n\n",
		c.Seed, c.Nodes, float64(c.Node.CPUMillis)/1000, c.Node.MemoryMiB/1024, c.Days, c.TasksPerDay,
		c.Nodes, float64(c.Node.CPUMillis)/1000, c.Node.MemoryMiB/1024, c.Node.DiskMiB/1024, len(Trace(c.Seed, c.Mix, c.Days, c.TasksPerDay)), c.Days, 100*c.HitRate)
	fmt.Fprintf(&b, "| policy | stranded (GiB·h/day) | fragmented for a long task | cold starts | layer fetches | tasks that waited | wait p50 | wait p99 | memory used | busy nodes | pool idle (GiB·h/day) | nodes for p99 wait ≤ %s |\n", c.WaitSLO)
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Results {
		nodes := "—"
		switch {
		case x.NodesForSLO > 0:
			nodes = fmt.Sprint(x.NodesForSLO)
		case x.NodesForSLO < 0:
			nodes = fmt.Sprintf("> %d", 4*c.Nodes)
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.2f%% | %.1f%% | %.1f%% | %.2f%% | %.1f s | %.1f s | %.1f%% | %.1f | %.1f | %s |\n",
			x.Policy, x.StrandedGiBh, x.FragmentedPct, x.ColdStartPct, x.LayerFetchPct, x.WaitedPct, x.WaitP50S, x.WaitP99S,
			x.MemoryUsedPct, x.BusyNodes, x.PoolIdleGiBh, nodes)
	}
	if len(r.Results) > 1 {
		verb := "less"
		less := r.StrandedLessPct
		if less < 0 {
			verb, less = "more", -less
		}
		fmt.Fprintf(&b, "\nberth strands %.1f%% %s memory than best-of-3 (goal: at least 20%% less, at an equal or lower cold-start rate: %.1f%% vs %.1f%%). Interactive sessions idle between turns %.1f GiB·h/day under every policy.\n",
			less, verb, r.Results[0].ColdStartPct, r.Results[1].ColdStartPct, r.Results[0].SessionIdleGiBh)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

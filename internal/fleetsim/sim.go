// Package fleetsim is berth's fleet simulator (`berth sim`): it replays a
// task mix on simulated nodes with the real placement.Place and the real
// placement.PoolSize, and runs the same trace with an E2B-style best-of-3
// least-loaded placement and with round-robin, so the three can be compared
// on stranded capacity, cold starts, waits for a slot, nodes needed and
// idle cost. It owns nothing but the run in hand: pure Go, deterministic
// for a seed, no I/O (the CLI prints the Report). docs/CLUSTER.md defines
// the model and every metric.
package fleetsim

import (
	"container/heap"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/placement"
)

// Config is one simulation.
type Config struct {
	Seed        uint64              `json:"seed"`
	Nodes       int                 `json:"nodes"`
	Node        placement.Resources `json:"node"` // each node's capacity
	Days        float64             `json:"days"`
	TasksPerDay int                 `json:"tasks_per_day"`
	Mix         []Kind              `json:"mix"`
	// HitRate is the warm-pool sizing target (placement.PoolInput.HitRate).
	HitRate float64 `json:"hit_rate"`
	// WaitSLO: the p99 wait for a slot the "nodes needed" column sizes for.
	WaitSLO time.Duration `json:"wait_slo"`
	// SizeNodes runs the search for the node count each policy needs.
	SizeNodes bool `json:"size_nodes"`
	// Start latencies: a warm claim, a cold start with the layers cached,
	// and the layer fetch a node without them adds.
	WarmStart, ColdStart, LayerFetch time.Duration `json:"-"`
	// CacheTemplates: templates whose layers a node keeps (LRU).
	CacheTemplates int `json:"cache_templates"`
}

// DefaultConfig is `berth sim` without flags.
func DefaultConfig() Config {
	return Config{
		Seed: 1, Nodes: 24, Node: placement.Resources{CPUMillis: 32000, MemoryMiB: 64 * 1024, DiskMiB: 1000 * 1024},
		Days: 2, TasksPerDay: 10000, Mix: DefaultMix(), HitRate: 0.9, WaitSLO: 10 * time.Second, SizeNodes: true,
		WarmStart: 200 * time.Millisecond, ColdStart: 2 * time.Second, LayerFetch: 20 * time.Second, CacheTemplates: 16,
	}
}

// Validate names the bad setting.
func (c Config) Validate() error {
	switch {
	case c.Nodes < 1:
		return errs.Field("nodes", "must be at least 1, not %d", c.Nodes)
	case c.Node.CPUMillis <= 0 || c.Node.MemoryMiB <= 0 || c.Node.DiskMiB <= 0:
		return errs.Field("node", "cpu, memory and disk must be positive")
	case c.Days <= 0 || c.Days > 60:
		return errs.Field("days", "must be in (0, 60], not %g", c.Days)
	case c.TasksPerDay < 1 || c.TasksPerDay > 1_000_000:
		return errs.Field("tasks-per-day", "must be in [1, 1000000], not %d", c.TasksPerDay)
	case c.HitRate <= 0 || c.HitRate >= 1:
		return errs.Field("hit-rate", "must be in (0, 1), not %g", c.HitRate)
	case len(c.Mix) == 0:
		return errs.Field("mix", "is empty")
	}
	for _, k := range c.Mix {
		if !(placement.Resources{CPUMillis: c.Node.CPUMillis, MemoryMiB: c.Node.MemoryMiB, DiskMiB: c.Node.DiskMiB}).Covers(k.Shape) {
			return errs.Field("node", "a %s task (%d MiB, %d millicores) does not fit an empty node", k.Name, k.Shape.MemoryMiB, k.Shape.CPUMillis)
		}
	}
	return nil
}

// epoch is the simulated start: a Monday, 00:00 UTC.
var epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

type evKind int

const (
	evArrival evKind = iota
	evEnd
	evRefilled
	evTick
)

type event struct {
	at   time.Duration
	seq  int
	kind evKind
	task int    // arrival, end
	node int    // end, refilled
	fp   string // refilled
	id   string // end
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// poolSide is what a node keeps of one template's pool besides placement.Pool.
type poolSide struct {
	rate      placement.Rate
	refilling int
	each      placement.Resources
}

type runInfo struct {
	res  placement.Resources // what the sandbox holds
	task int
}

// The pool loop's settings: how often a node resizes, the rate estimator's
// time constant, the idle bound and cap of PoolInput, and the memory a
// refill leaves free (the largest task of the mix).
const (
	poolTick    = 30 * time.Second
	rateTau     = 30 * time.Minute
	poolMaxIdle = 10 * time.Minute
	poolMax     = 8
)

type sim struct {
	cfg      Config
	pol      placement.Policy
	place    Placer
	trace    []Task
	nodes    []placement.Node
	pools    []map[string]*poolSide
	poolFPs  [][]string // each node's pool templates, sorted (the tick's order)
	poolMem  []int64    // memory each node's pool members hold, ready or starting
	running  []map[string]runInfo
	byName   map[string]int
	events   eventHeap
	seq      int
	now      time.Duration
	queue    []int // waiting tasks, oldest first
	median   int   // medianWaiting's answer while the queue is unchanged, else -1
	req      []placement.Request
	learner  *placement.Learner
	long     placement.Request // the reference long request of the stranded metric
	headroom int64             // memory a pool refill leaves free

	// integrals over time, in MiB·s
	lastAt                                    time.Duration
	busy                                      float64 // node·s with a sandbox running
	stranded, strandedWaiting, poolIdle, used float64
	sessionIdle                               float64
	waits                                     []time.Duration
	cold, fetches, placed                     int
	ended                                     bool
}

func (s *sim) at() time.Time { return epoch.Add(s.now) }

func (s *sim) push(e event) {
	e.seq = s.seq
	s.seq++
	heap.Push(&s.events, e)
}

// simulate runs one trace with one placer on n nodes.
func simulate(cfg Config, trace []Task, pd PolicyDef, seed uint64, n int) Result {
	s := &sim{cfg: cfg, pol: placement.DefaultPolicy(), place: pd.New(seed), trace: trace, byName: map[string]int{},
		median: -1, learner: placement.NewLearner(), req: make([]placement.Request, len(trace))}
	for _, k := range cfg.Mix {
		if k.Shape.MemoryMiB > s.long.Resources.MemoryMiB {
			s.long = placement.Request{ID: "reference", Resources: k.Shape, Runtime: "runsc", Class: placement.Long, Expected: k.Median}
		}
	}
	s.headroom = s.long.Resources.MemoryMiB
	for i := range n {
		name := fmt.Sprintf("node-%02d", i)
		s.byName[name] = i
		s.nodes = append(s.nodes, placement.Node{Name: name, Capacity: cfg.Node, Runtimes: []string{"runc", "runsc"},
			Capabilities: []string{"memory-checkpoint"}, Ready: true})
		s.pools = append(s.pools, map[string]*poolSide{})
		s.poolFPs = append(s.poolFPs, nil)
		s.poolMem = append(s.poolMem, 0)
		s.running = append(s.running, map[string]runInfo{})
	}
	for i, t := range trace {
		s.push(event{at: t.Arrival, kind: evArrival, task: i})
	}
	span := time.Duration(cfg.Days * 24 * float64(time.Hour))
	s.push(event{at: poolTick, kind: evTick})
	for s.events.Len() > 0 {
		e := heap.Pop(&s.events).(event)
		if e.at > span && !s.ended {
			s.integrate(span)
			s.ended = true // metrics cover the span; the run goes on so every task ends
		}
		if !s.ended {
			s.integrate(e.at)
		}
		s.now = e.at
		switch e.kind {
		case evArrival:
			s.arrive(e.task)
		case evEnd:
			s.end(e.node, e.id, e.task)
		case evRefilled:
			s.refilled(e.node, e.fp)
		case evTick:
			s.tick()
			if s.now+poolTick <= span {
				s.push(event{at: s.now + poolTick, kind: evTick})
			}
		}
	}
	if !s.ended {
		s.integrate(span)
	}
	return s.result(n, span)
}

// integrate adds the state since the last event to the time integrals.
func (s *sim) integrate(to time.Duration) {
	dt := (to - s.lastAt).Seconds()
	s.lastAt = to
	if dt <= 0 {
		return
	}
	t := s.at()
	var str, strW, poolMem, used, busy float64
	var oldest *placement.Request
	if len(s.queue) > 0 {
		oldest = s.medianWaiting()
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		free := float64(n.Capacity.MemoryMiB - n.Allocated.MemoryMiB)
		pm := s.poolMemory(i)
		poolMem += float64(pm)
		used += float64(n.Allocated.MemoryMiB - pm)
		if len(n.Running) > 0 {
			busy++
		}
		if free <= 0 {
			continue
		}
		bare := s.withoutPools(i)
		if ok, _ := s.pol.Fits(s.long, &bare, t); !ok {
			str += free
		}
		if oldest != nil {
			if ok, _ := s.pol.Fits(*oldest, &bare, t); !ok {
				strW += free
			}
		}
	}
	s.stranded += str * dt
	s.poolIdle += poolMem * dt
	s.used += used * dt
	s.busy += busy * dt
	if oldest != nil {
		s.strandedWaiting += strW * dt
	}
}

// medianWaiting is the waiting request of median memory (the older of
// two equal ones): the one the stranded metric asks the nodes to take.
func (s *sim) medianWaiting() *placement.Request {
	if s.median >= 0 {
		return &s.req[s.median]
	}
	w := slices.Clone(s.queue)
	slices.SortStableFunc(w, func(a, b int) int {
		return int(s.req[a].Resources.MemoryMiB - s.req[b].Resources.MemoryMiB)
	})
	s.median = w[(len(w)-1)/2]
	return &s.req[s.median]
}

// poolMemory is the memory node i's pool members hold (ready or starting).
func (s *sim) poolMemory(i int) int64 { return s.poolMem[i] }

// withoutPools is node i as it would be with its ready members reclaimed.
func (s *sim) withoutPools(i int) placement.Node {
	n := s.nodes[i]
	for _, pl := range n.Pools {
		n.Allocated = n.Allocated.Sub(scale(memDisk(pl.Each), pl.Ready))
	}
	n.Pools = nil
	return n
}

// memDisk is what an idle pool member holds of r: its memory and disk (it
// is charged no CPU until claimed).
func memDisk(r placement.Resources) placement.Resources {
	return placement.Resources{MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB}
}

func scale(r placement.Resources, k int) placement.Resources {
	return placement.Resources{CPUMillis: r.CPUMillis * int64(k), MemoryMiB: r.MemoryMiB * int64(k), DiskMiB: r.DiskMiB * int64(k)}
}

func (s *sim) arrive(ti int) {
	s.req[ti] = s.learner.Fill(s.trace[ti].Request)
	if !s.try(ti) {
		s.queue = append(s.queue, ti)
		s.median = -1
	}
}

// try places task ti now if some node takes it, reclaiming ready pool
// members when only that makes room (a pool member is not a user's
// sandbox: reclaiming it is not an eviction).
func (s *sim) try(ti int) bool {
	req := s.req[ti]
	t := s.at()
	d, err := s.place(req, s.nodes, t)
	if err != nil {
		bare := make([]placement.Node, len(s.nodes))
		for i := range s.nodes {
			bare[i] = s.withoutPools(i)
		}
		d2, err := s.place(req, bare, t)
		if err != nil {
			return false
		}
		i := s.byName[d2.Node]
		s.reclaimFor(i, req)
		d = decide(s.pol, req, &s.nodes[i], t)
		d.Class, d.Expected = d2.Class, d2.Expected
	}
	s.start(ti, req, d)
	return true
}

// reclaimFor drops ready members on node i, other templates' first, until req fits.
func (s *sim) reclaimFor(i int, req placement.Request) {
	n := &s.nodes[i]
	order := slices.Clone(n.Pools)
	sort.SliceStable(order, func(a, b int) bool {
		return (order[a].Fingerprint != req.Fingerprint) && (order[b].Fingerprint == req.Fingerprint)
	})
	for _, pl := range order {
		for k := 0; k < pl.Ready; k++ {
			if ok, _ := s.pol.Fits(req, n, s.at()); ok {
				return
			}
			s.dropMember(i, pl.Fingerprint)
		}
	}
}

func (s *sim) dropMember(i int, fp string) {
	n := &s.nodes[i]
	for j := range n.Pools {
		if n.Pools[j].Fingerprint == fp && n.Pools[j].Ready > 0 {
			n.Pools[j].Ready--
			n.Allocated = n.Allocated.Sub(memDisk(n.Pools[j].Each))
			s.poolMem[i] -= n.Pools[j].Each.MemoryMiB
			return
		}
	}
}

func (s *sim) start(ti int, req placement.Request, d placement.Decision) {
	t := &s.trace[ti]
	i := s.byName[d.Node]
	n := &s.nodes[i]
	lat := s.cfg.WarmStart
	if d.WarmHit {
		p := placement.WarmPool(req, n)
		n.Pools[p].Ready--
		s.poolMem[i] -= req.Resources.MemoryMiB
		// the member's memory and disk pass to the sandbox; its CPU is charged now
		n.Allocated.CPUMillis += req.Resources.CPUMillis
	} else {
		n.Allocated = n.Allocated.Add(req.Resources)
		s.cold++
		lat = s.cfg.ColdStart
		if !slices.Contains(n.Cached, req.Fingerprint) {
			s.fetches++
			lat += s.cfg.LayerFetch
		}
	}
	s.touchCache(i, req.Fingerprint)
	id := req.ID
	n.Running = append(n.Running, placement.Running{ID: id, Owner: req.Owner, CPUMillis: req.Resources.CPUMillis, MemoryMiB: req.Resources.MemoryMiB, Class: d.Class, EndsAt: s.at().Add(d.Expected)})
	s.running[i][id] = runInfo{res: req.Resources, task: ti}
	ps := s.pool(i, req)
	ps.rate.Observe(s.at())
	// Every task arrives within the span; one placed after it (it waited
	// past the end) still counts with its whole wait.
	s.waits = append(s.waits, s.now-t.Arrival)
	s.placed++
	if t.Active > 0 {
		s.sessionIdle += (1 - t.Active) * float64(req.Resources.MemoryMiB) * t.Duration.Seconds()
	}
	s.push(event{at: s.now + lat + t.Duration, kind: evEnd, task: ti, node: i, id: id})
	if d.WarmHit {
		s.refill(i, req.Fingerprint)
	}
}

func (s *sim) pool(i int, req placement.Request) *poolSide {
	ps := s.pools[i][req.Fingerprint]
	if ps == nil {
		ps = &poolSide{rate: placement.Rate{Tau: rateTau}, each: req.Resources}
		s.pools[i][req.Fingerprint] = ps
		k, _ := slices.BinarySearch(s.poolFPs[i], req.Fingerprint)
		s.poolFPs[i] = slices.Insert(s.poolFPs[i], k, req.Fingerprint)
	}
	return ps
}

func (s *sim) touchCache(i int, fp string) {
	n := &s.nodes[i]
	if j := slices.Index(n.Cached, fp); j >= 0 {
		n.Cached = slices.Delete(n.Cached, j, j+1)
	}
	n.Cached = append(n.Cached, fp)
	if len(n.Cached) > s.cfg.CacheTemplates {
		n.Cached = n.Cached[len(n.Cached)-s.cfg.CacheTemplates:]
	}
}

func (s *sim) end(i int, id string, ti int) {
	n := &s.nodes[i]
	ri := s.running[i][id]
	delete(s.running[i], id)
	n.Allocated = n.Allocated.Sub(ri.res)
	n.Running = slices.DeleteFunc(n.Running, func(r placement.Running) bool { return r.ID == id })
	s.learner.Observe(s.trace[ti].Fingerprint, s.trace[ti].Duration)
	s.drain()
}

// drain places waiting tasks, oldest first, while nodes take them.
func (s *sim) drain() {
	if len(s.queue) == 0 {
		return
	}
	// A shape that found no node is not tried again in the same pass: the
	// nodes only fill up as the pass goes on.
	type shape struct {
		res   placement.Resources
		class placement.Class
	}
	failed := map[shape]bool{}
	kept := s.queue[:0]
	for _, ti := range s.queue {
		class, _ := s.pol.Expect(s.req[ti])
		sh := shape{s.req[ti].Resources, class}
		if !failed[sh] && s.try(ti) {
			continue
		}
		failed[sh] = true
		kept = append(kept, ti)
	}
	if len(kept) != len(s.queue) {
		s.median = -1
	}
	s.queue = kept
}

// target is the pool size node i wants for a template now.
func (s *sim) target(ps *poolSide) int {
	return placement.PoolSize(placement.PoolInput{Rate: ps.rate.At(s.at()), Refill: s.cfg.ColdStart, HitRate: s.cfg.HitRate,
		MaxIdle: poolMaxIdle, Max: poolMax})
}

// refill starts members on node i for fp up to its target, leaving the
// headroom free (room for the mix's largest request).
func (s *sim) refill(i int, fp string) {
	ps := s.pools[i][fp]
	if ps == nil {
		return
	}
	n := &s.nodes[i]
	want := s.target(ps)
	for ready(n, fp)+ps.refilling < want {
		free := n.Capacity.Sub(n.Allocated).Sub(ps.each)
		if free.MemoryMiB < s.headroom || free.DiskMiB < 0 {
			return
		}
		n.Allocated = n.Allocated.Add(memDisk(ps.each))
		s.poolMem[i] += ps.each.MemoryMiB
		ps.refilling++
		lat := s.cfg.ColdStart
		if !slices.Contains(n.Cached, fp) {
			lat += s.cfg.LayerFetch
		}
		s.touchCache(i, fp)
		s.push(event{at: s.now + lat, kind: evRefilled, node: i, fp: fp})
	}
}

func ready(n *placement.Node, fp string) int {
	for _, pl := range n.Pools {
		if pl.Fingerprint == fp {
			return pl.Ready
		}
	}
	return 0
}

func (s *sim) refilled(i int, fp string) {
	ps := s.pools[i][fp]
	ps.refilling--
	n := &s.nodes[i]
	for j := range n.Pools {
		if n.Pools[j].Fingerprint == fp {
			n.Pools[j].Ready++
			return
		}
	}
	n.Pools = append(n.Pools, placement.Pool{Fingerprint: fp, Ready: 1, Each: ps.each})
}

// tick resizes every node's pools to their targets.
func (s *sim) tick() {
	freed := false
	for i := range s.nodes {
		for _, fp := range s.poolFPs[i] {
			ps := s.pools[i][fp]
			if ps.refilling == 0 && ready(&s.nodes[i], fp) == 0 && ps.rate.At(s.at())*poolMaxIdle.Seconds() < 1 {
				continue // no members and too few claims for any
			}
			want := s.target(ps)
			for ready(&s.nodes[i], fp)+ps.refilling > want && ready(&s.nodes[i], fp) > 0 {
				s.dropMember(i, fp)
				freed = true
			}
			s.refill(i, fp)
		}
	}
	if freed {
		s.drain()
	}
}

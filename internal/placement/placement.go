// Package placement decides which node runs a sandbox, and how many warm
// members a node keeps per template. It owns no state and does no I/O:
// Place takes the request, the fleet as its node agents last reported it,
// and the time, and returns a decision or the reason nothing fits; the
// scheduler loop around it (cluster mode) and the fleet simulator
// (internal/fleetsim) are thin. The rules, from issue 16 (docs/CLUSTER.md
// says why each one is there):
//
//   - memory and disk are never overcommitted;
//   - CPU may be, by duration class: short and interactive sandboxes are
//     charged a fraction of their CPU, long ones all of it;
//   - a warm-pool member of the request's template is preferred, then a node
//     that has the template's layers cached;
//   - nothing is ever evicted: a request that fits nowhere waits, with the
//     reason (which resource, on how many nodes);
//   - duration-aware: a request goes where its expected end is close to the
//     node's own drain time, so a node's sandboxes end together and the node
//     becomes whole again, and a long task does not pin a node of short ones;
//   - the rest is best fit, so free memory stays in large pieces, and a
//     placement that would leave a node a piece too small for a large
//     request costs more (that piece is free memory nobody can use).
package placement

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Resources is an amount of CPU, memory and disk.
type Resources struct {
	CPUMillis int64 `json:"cpu_millis"`
	MemoryMiB int64 `json:"memory_mib"`
	DiskMiB   int64 `json:"disk_mib"`
}

// Add returns r+o.
func (r Resources) Add(o Resources) Resources {
	return Resources{r.CPUMillis + o.CPUMillis, r.MemoryMiB + o.MemoryMiB, r.DiskMiB + o.DiskMiB}
}

// Sub returns r-o.
func (r Resources) Sub(o Resources) Resources {
	return Resources{r.CPUMillis - o.CPUMillis, r.MemoryMiB - o.MemoryMiB, r.DiskMiB - o.DiskMiB}
}

// Covers reports whether r is at least o in every dimension.
func (r Resources) Covers(o Resources) bool {
	return r.CPUMillis >= o.CPUMillis && r.MemoryMiB >= o.MemoryMiB && r.DiskMiB >= o.DiskMiB
}

// Class is a sandbox's expected-duration class.
type Class string

const (
	// Short: a lint or test run, seconds to minutes; CPU bursts, packed densely.
	Short Class = "short"
	// Interactive: a session with a person or a model in the loop, idle between turns.
	Interactive Class = "interactive"
	// Long: a migration, a build, an agent working for hours; uses its CPU.
	Long Class = "long"
)

// Classes lists the classes in the order of the flag's help.
var Classes = []Class{Short, Interactive, Long}

// ParseClass parses a class name; "" is no class (the caller learns one).
func ParseClass(field, s string) (Class, error) {
	switch c := Class(strings.TrimSpace(s)); c {
	case "", Short, Interactive, Long:
		return c, nil
	}
	return "", errs.Field(field, "%q is not a duration class (short, interactive or long)", s)
}

// LabelSelectorPrefix marks a request label that selects nodes: a request
// labelled node.berth.dev/zone=eu runs only on a node labelled zone=eu.
const LabelSelectorPrefix = "node.berth.dev/"

// Request is one sandbox to place.
type Request struct {
	ID        string    `json:"id"`
	Resources Resources `json:"resources"`
	Runtime   string    `json:"runtime"`
	// Capabilities the node's runtime must have (e.g. "memory-checkpoint").
	Capabilities []string `json:"capabilities,omitempty"`
	Fingerprint  string   `json:"fingerprint"`
	// Class and Expected are the expected duration: Expected wins when set,
	// else the class's default (Policy.ClassDuration). The caller fills a
	// learned estimate (Learner) when the user gave neither.
	Class    Class             `json:"class,omitempty"`
	Expected time.Duration     `json:"expected,omitempty"`
	Owner    string            `json:"owner"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Running is a sandbox a node runs, as far as placement cares.
type Running struct {
	ID        string    `json:"id"`
	Owner     string    `json:"owner"`
	CPUMillis int64     `json:"cpu_millis"`
	MemoryMiB int64     `json:"memory_mib"`
	Class     Class     `json:"class"`
	EndsAt    time.Time `json:"ends_at"` // expected end
}

// Pool is a node's warm pool for one template: Ready members of shape Each.
type Pool struct {
	Fingerprint string    `json:"fingerprint"`
	Ready       int       `json:"ready"`
	Each        Resources `json:"each"`
}

// Node is a node as its agent last reported it.
type Node struct {
	Name     string    `json:"name"`
	Capacity Resources `json:"capacity"`
	// Allocated is the memory and disk held on the node, pool members
	// included; it is authoritative for the memory and disk checks. CPU is
	// charged from Running by class (see Policy.Overcommit).
	Allocated    Resources         `json:"allocated"`
	Runtimes     []string          `json:"runtimes"`
	Capabilities []string          `json:"capabilities,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Cached       []string          `json:"cached,omitempty"` // template fingerprints with layers on the node
	Pools        []Pool            `json:"pools,omitempty"`
	Running      []Running         `json:"running,omitempty"`
	Ready        bool              `json:"ready"`
	Lost         bool              `json:"lost"`
	LeaseExpires time.Time         `json:"lease_expires"`
}

// Decision is where a request goes.
type Decision struct {
	Node        string        `json:"node"`
	WarmHit     bool          `json:"warm_hit"`  // a pool member of the template is taken
	CacheHit    bool          `json:"cache_hit"` // the template's layers are on the node
	Class       Class         `json:"class"`
	Expected    time.Duration `json:"expected"`
	ExpectedEnd time.Time     `json:"expected_end"`
	Cost        float64       `json:"cost"` // lower is better; for explanations
}

// Policy holds the tunables of Place. DefaultPolicy is what berth runs.
type Policy struct {
	// Overcommit is the CPU overcommit factor per class: a sandbox asking
	// for c millicores is charged c/Overcommit[class] of the node's CPU.
	Overcommit map[Class]float64
	// ClassDuration is the expected duration of a class when the request
	// gives none.
	ClassDuration map[Class]time.Duration
	// ShortMax: an expected duration up to it makes an unclassed request short.
	ShortMax time.Duration

	// Cost weights (see cost in score.go).
	WarmBonus, CacheBonus, DrainWeight, FitWeight, OpenWeight, SpreadWeight float64
	// FragWeight is charged when placing leaves a node with some free
	// memory but less than LargeMiB (the largest request commonly seen):
	// a piece too small for it, free but stranded.
	FragWeight float64
	LargeMiB   int64
}

// DefaultPolicy is berth's placement policy.
func DefaultPolicy() Policy {
	return Policy{
		Overcommit:    map[Class]float64{Short: 2, Interactive: 4, Long: 1},
		ClassDuration: map[Class]time.Duration{Short: 2 * time.Minute, Interactive: 45 * time.Minute, Long: 2 * time.Hour},
		ShortMax:      15 * time.Minute,
		WarmBonus:     4,
		CacheBonus:    0.5,
		DrainWeight:   2,
		FitWeight:     1,
		OpenWeight:    1,
		SpreadWeight:  0.25,
		FragWeight:    3,
		LargeMiB:      8 * 1024,
	}
}

// Place decides with DefaultPolicy.
func Place(req Request, nodes []Node, now time.Time) (Decision, error) {
	return DefaultPolicy().Place(req, nodes, now)
}

// Place returns the node of least cost among those the request fits, or a
// ResourceExhausted error wrapping *NoFit when none does.
func (p Policy) Place(req Request, nodes []Node, now time.Time) (Decision, error) {
	if err := ValidateRequest(req); err != nil {
		return Decision{}, err
	}
	class, expected := p.Expect(req)
	nf := &NoFit{Nodes: len(nodes), Need: req.Resources, Counts: map[Reason]int{}}
	best, bestCost := -1, 0.0
	var bestWarm, bestCache bool
	for i := range nodes {
		n := &nodes[i]
		if r := p.check(req, class, n, now); r != "" {
			nf.Counts[r]++
			if r == ReasonMemory {
				nf.MostFreeMiB = max(nf.MostFreeMiB, n.Capacity.MemoryMiB-n.Allocated.MemoryMiB)
			}
			continue
		}
		c, warm, cache := p.cost(req, class, expected, n, now)
		if best < 0 || c < bestCost || (c == bestCost && n.Name < nodes[best].Name) {
			best, bestCost, bestWarm, bestCache = i, c, warm, cache
		}
	}
	if best < 0 {
		return Decision{}, &errs.Error{Kind: errs.ResourceExhausted, Err: nf}
	}
	return Decision{
		Node: nodes[best].Name, WarmHit: bestWarm, CacheHit: bestCache,
		Class: class, Expected: expected, ExpectedEnd: now.Add(expected), Cost: bestCost,
	}, nil
}

// ValidateRequest refuses a request no node could ever take for what it is.
func ValidateRequest(req Request) error {
	switch {
	case req.Resources.CPUMillis <= 0:
		return errs.Field("resources.cpu_millis", "must be positive, not %d", req.Resources.CPUMillis)
	case req.Resources.MemoryMiB <= 0:
		return errs.Field("resources.memory_mib", "must be positive, not %d", req.Resources.MemoryMiB)
	case req.Resources.DiskMiB < 0:
		return errs.Field("resources.disk_mib", "must not be negative, not %d", req.Resources.DiskMiB)
	case req.Expected < 0:
		return errs.Field("expected_duration", "must not be negative, not %s", req.Expected)
	}
	_, err := ParseClass("expected_class", string(req.Class))
	return err
}

// Expect returns the request's class and expected duration: the request's
// own duration when given, else its class's default; a request without a
// class is short up to ShortMax and long beyond.
func (p Policy) Expect(req Request) (Class, time.Duration) {
	class, d := req.Class, req.Expected
	if d <= 0 {
		if class == "" {
			class = Long // nothing known: assume the worst for CPU
		}
		d = p.ClassDuration[class]
	}
	if class == "" {
		class = Long
		if d <= p.ShortMax {
			class = Short
		}
	}
	return class, d
}

// Reason is why a node cannot take a request.
type Reason string

const (
	ReasonNotReady   Reason = "not ready"
	ReasonLost       Reason = "lost"
	ReasonLease      Reason = "lease expired"
	ReasonRuntime    Reason = "runtime"
	ReasonCapability Reason = "capability"
	ReasonSelector   Reason = "node labels"
	ReasonMemory     Reason = "memory"
	ReasonCPU        Reason = "cpu"
	ReasonDisk       Reason = "disk"
)

var reasonOrder = []Reason{ReasonNotReady, ReasonLost, ReasonLease, ReasonRuntime, ReasonCapability, ReasonSelector, ReasonMemory, ReasonCPU, ReasonDisk}

// NoFit says why no node takes a request: per reason, on how many nodes it
// was the first that failed (a node counts once).
type NoFit struct {
	Nodes       int
	Need        Resources
	Counts      map[Reason]int
	MostFreeMiB int64 // the most free memory on a node refused for memory
}

func (e *NoFit) Error() string {
	if e.Nodes == 0 {
		return "no node fits: there are no nodes"
	}
	var parts []string
	for _, r := range reasonOrder {
		n := e.Counts[r]
		if n == 0 {
			continue
		}
		s := fmt.Sprintf("%s on %d node%s", r, n, plural(n))
		if r == ReasonMemory {
			s += fmt.Sprintf(" (needs %d MiB, at most %d MiB free)", e.Need.MemoryMiB, e.MostFreeMiB)
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("no node fits (of %d): %s", e.Nodes, strings.Join(parts, ", "))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Fits reports whether n can take req now under policy p, and if not the
// first reason it cannot. The baselines of the simulator use it, so every
// policy obeys the same rules and differs only in its choice.
func (p Policy) Fits(req Request, n *Node, now time.Time) (bool, Reason) {
	class, _ := p.Expect(req)
	r := p.check(req, class, n, now)
	return r == "", r
}

func (p Policy) check(req Request, class Class, n *Node, now time.Time) Reason {
	switch {
	case !n.Ready:
		return ReasonNotReady
	case n.Lost:
		return ReasonLost
	case !n.LeaseExpires.IsZero() && !now.Before(n.LeaseExpires):
		return ReasonLease
	case req.Runtime != "" && !slices.Contains(n.Runtimes, req.Runtime):
		return ReasonRuntime
	}
	for _, c := range req.Capabilities {
		if !slices.Contains(n.Capabilities, c) {
			return ReasonCapability
		}
	}
	for k, v := range req.Labels {
		if key, ok := strings.CutPrefix(k, LabelSelectorPrefix); ok && n.Labels[key] != v {
			return ReasonSelector
		}
	}
	free := n.Capacity.Sub(n.Allocated)
	if warmMember(req, n) >= 0 {
		// The member's memory and disk are held already; the request takes them over.
		free = free.Add(Resources{MemoryMiB: req.Resources.MemoryMiB, DiskMiB: req.Resources.DiskMiB})
	}
	if free.MemoryMiB < req.Resources.MemoryMiB {
		return ReasonMemory
	}
	if p.chargedCPU(n)+p.charge(req.Resources.CPUMillis, class) > float64(n.Capacity.CPUMillis) {
		return ReasonCPU
	}
	if free.DiskMiB < req.Resources.DiskMiB {
		return ReasonDisk
	}
	return ""
}

// charge is the CPU a sandbox of class uses up on a node.
func (p Policy) charge(cpu int64, class Class) float64 {
	f := p.Overcommit[class]
	if f < 1 {
		f = 1
	}
	return float64(cpu) / f
}

func (p Policy) chargedCPU(n *Node) float64 {
	var sum float64
	for _, r := range n.Running {
		sum += p.charge(r.CPUMillis, r.Class)
	}
	return sum
}

// warmMember returns the index of a pool on n with a ready member that can
// serve req (same template, a shape covering the request), or -1.
func warmMember(req Request, n *Node) int {
	for i, pl := range n.Pools {
		if pl.Ready > 0 && pl.Fingerprint == req.Fingerprint && req.Fingerprint != "" && pl.Each.Covers(req.Resources) &&
			pl.Each.MemoryMiB == req.Resources.MemoryMiB && pl.Each.DiskMiB == req.Resources.DiskMiB {
			return i
		}
	}
	return -1
}

// WarmPool returns the index into n.Pools of the member Place would take for req, or -1.
func WarmPool(req Request, n *Node) int { return warmMember(req, n) }

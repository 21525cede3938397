// Package pool keeps warm pools: per template, ready sandboxes of one shape
// (template fingerprint, runtime, resources) owned by Owner, handed out on
// create. It owns the pool specs (stored as one setting), the pools' live
// state (ready members, targets, hits, misses, backoff) and the fill loop.
//
// What a pass does is decided by the pure Plan (which members to hand out,
// drain or start, the auto-sized target, the pool's status); the loop around
// it is thin and applies the plan through the narrow Core interface to the
// lifecycle core (satisfied by *daemon.Daemon).
//
// Locks: Service.mu guards the live state only. It is never held while
// calling the core, so it is never held together with a sandbox lock
// (Core.Lock) or the store's.
package pool

import (
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// Owner owns warm pool members until a create claims one. It can never be
// a user's name (owner names start with a letter or digit).
const Owner = "_pool"

const (
	setting        = "pools" // settings key: JSON map template → Spec
	MaxSize        = 100     // most members one pool may keep
	fillParallel   = 2       // members started at once, across pools
	tick           = 250 * time.Millisecond
	backoffMax     = time.Minute     // longest wait after failed starts
	shrinkAfter    = 2 * time.Minute // auto pools shrink after this long without a miss
	latencySamples = 512
	refillDelay    = 100 * time.Millisecond
)

// Pool states reported in Status.State.
const (
	StateFilling = "filling"
	StateReady   = "ready"
	StateBackoff = "backoff"
	StateWaiting = "waiting"
)

// IsMember reports whether sb is an unclaimed warm pool member: hidden
// from listings, never expired or reaped.
func IsMember(sb *sandbox.Sandbox) bool { return sb.Owner == Owner }

// Spec is one warm pool's configuration, keyed by template name.
type Spec struct {
	Template  string            `json:"template"`
	Size      int               `json:"size"`
	Runtime   string            `json:"runtime,omitempty"`
	Resources sandbox.Resources `json:"resources"`
	// Auto sizes the pool between Min and Max from demand: a miss grows
	// it by one, a quiet spell shrinks it by one.
	Auto bool `json:"auto,omitempty"`
	Min  int  `json:"min,omitempty"`
	Max  int  `json:"max,omitempty"`
}

// Status is a pool's configuration and how it is doing.
type Status struct {
	Spec
	Fingerprint     string    `json:"fingerprint,omitempty"`
	Target          int       `json:"target"`
	Ready           int       `json:"ready"`
	Starting        int       `json:"starting"`
	Hits            int64     `json:"hits"`
	Misses          int64     `json:"misses"`
	ClaimP50Micros  int64     `json:"claim_p50_us"`
	ClaimP99Micros  int64     `json:"claim_p99_us"`
	IdleMemoryBytes uint64    `json:"idle_memory_bytes"`
	State           string    `json:"state"` // filling | ready | backoff | waiting
	Error           string    `json:"error,omitempty"`
	RetryAt         time.Time `json:"retry_at,omitzero"`
}

// Key identifies interchangeable sandboxes: template fingerprint, runtime
// and resource shape, with the server defaults filled in as create fills
// them.
func Key(fp, rt string, r sandbox.Resources, defRuntime string, def sandbox.Resources) string {
	if rt == "" {
		rt = defRuntime
	}
	r = WithDefaults(r, def)
	return fmt.Sprintf("%s|%s|%d|%d|%d|%d", fp, rt, r.CPUMillis, r.MemoryMiB, r.DiskMiB, r.Pids)
}

// WithDefaults fills r's zero fields from def.
func WithDefaults(r, def sandbox.Resources) sandbox.Resources {
	if r.CPUMillis == 0 {
		r.CPUMillis = def.CPUMillis
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = def.MemoryMiB
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = def.DiskMiB
	}
	if r.Pids == 0 {
		r.Pids = def.Pids
	}
	return r
}

// State is the part of a pool's live state a plan reads.
type State struct {
	Key        string // key handed out so far ("" = none)
	Target     int
	Starting   int // members being started
	RetryAt    time.Time
	LastMiss   time.Time
	LastResize time.Time
}

// Template is the pool's template as the store has it.
type Template struct {
	Ready       bool
	Fingerprint string
	Key         string // Key(Fingerprint, spec's runtime and shape)
	Err         string // why it is not ready
}

// Member is one pool member as the store has it.
type Member struct {
	ID         string
	Key        string // the key it was made for (its Attrs.Pool.Key)
	TemplateID string
	State      sandbox.State
}

// Drain is one member to delete and why.
type Drain struct {
	ID, Why string
}

// Actions is what one pass does to one pool.
type Actions struct {
	Key         string   // key the pool hands out from now on
	Invalidated bool     // Key replaces a different one: template rebuilt or shape changed
	Ready       []string // members to hand out, oldest first
	Drain       []Drain
	Create      int  // members to start now
	Target      int  // the (auto-sized) target
	Resized     bool // Target changed: LastResize = now
	Status      string
	SetErr      bool // replace the pool's error with Err
	Err         string
}

// Why members are drained.
const (
	whyTemplateGone = "template gone"
	whyStale        = "template fingerprint or pool shape changed"
	whyRemoved      = "pool removed"
	whyStartFailed  = "failed to start"
)

// Plan decides one pass over a pool: which members to hand out, which to
// drain (made for another fingerprint or shape, failed or stopped, or the
// newest surplus when the target shrank), how many to start, how an auto
// pool's target moves, and the pool's status. members are oldest first.
func Plan(now time.Time, spec Spec, st State, tpl Template, members []Member) Actions {
	if !tpl.Ready {
		a := Actions{Target: st.Target, Status: StateWaiting, SetErr: true, Err: tpl.Err}
		for _, m := range members {
			a.Drain = append(a.Drain, Drain{m.ID, whyTemplateGone})
		}
		return a
	}
	a := Actions{Key: tpl.Key, Invalidated: st.Key != tpl.Key && st.Key != "", Target: st.Target}
	var stale []string
	for _, m := range members {
		switch {
		case m.Key != tpl.Key || m.TemplateID != tpl.Fingerprint:
			stale = append(stale, m.ID)
		case m.State == sandbox.Running:
			a.Ready = append(a.Ready, m.ID)
		case m.State != sandbox.Creating:
			stale = append(stale, m.ID) // failed, stopped ...
		}
	}
	if spec.Auto && a.Target > spec.Min && now.Sub(st.LastMiss) > shrinkAfter && now.Sub(st.LastResize) > shrinkAfter {
		a.Target--
		a.Resized = true
	}
	// Too many (the target shrank): drain the newest surplus.
	for len(a.Ready) > max(a.Target, 0) {
		stale = append(stale, a.Ready[len(a.Ready)-1])
		a.Ready = a.Ready[:len(a.Ready)-1]
	}
	for _, id := range stale {
		a.Drain = append(a.Drain, Drain{id, whyStale})
	}
	need := a.Target - len(a.Ready) - st.Starting
	switch {
	case now.Before(st.RetryAt):
		a.Status = StateBackoff
		need = 0
	case need > 0 || st.Starting > 0:
		a.Status = StateFilling
	default:
		a.Status, a.SetErr = StateReady, true
	}
	a.Create = max(need, 0)
	return a
}

// Backoff is how long a pool waits after its failures-th failed start in a
// row: 1s doubling, at most a minute.
func Backoff(failures int) time.Duration {
	b := time.Second << min(max(failures-1, 0), 6)
	return min(b, backoffMax)
}

// initialTarget is a pool's target when its spec is set.
func initialTarget(spec Spec) int {
	if spec.Auto {
		return min(max(spec.Size, spec.Min), spec.Max)
	}
	return spec.Size
}

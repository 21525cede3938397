// Package admission owns what sandboxes may take and what they took:
// quota admission (the admission lock and the reservations of starts and
// snapshot captures in progress), the live activity signals the reaper
// reads (open streams, in-flight egress, the last API call), metering and
// usage reports, the /metrics exposition, and the reaper loop that folds
// live signals into persisted ones and applies reaper.Decide. It reaches the
// lifecycle core only through Core (and the reaper's actions through
// ReaperCore).
//
// Locks: mu (live signals), admitMu (quota check + insert) and mMu
// (metrics counters) are never held together, except that observeRejection
// takes mMu while admitMu is held (admitMu → mMu). Lock order with the
// core: a sandbox's lock (Core.Lock) may be held when admitMu is taken
// (start, fork, snapshot); a warm pool claim holds admitMu while it takes a
// pool member's lock, and pool members are never started, forked or
// snapshotted by owners, so the two orders never meet on one sandbox.
package admission

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what admission and metering need of the lifecycle core
// (*daemon.Daemon).
type Core interface {
	Store() store.Store
	// Visible loads a sandbox as owner may see it ("" = admin).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	SandboxDir(id string) string
	Log() *slog.Logger
	Now() time.Time
}

// Config is the part of the server configuration admission reads.
type Config struct {
	Reaper     reaper.Config
	Quotas     quota.Config
	Prices     metering.Prices
	CgroupRoot string // cgroup v1 mount root, for throttling
}

// Validate checks the reaper, quota and price config.
func (c Config) Validate() error {
	if err := c.Reaper.Validate(); err != nil {
		return err
	}
	if err := c.Quotas.Validate(); err != nil {
		return err
	}
	if err := c.Prices.Validate(); err != nil {
		return err
	}
	if c.Reaper.Interval.D() < 100*time.Millisecond {
		return errs.Field("reaper.interval", "must be at least 100ms")
	}
	return nil
}

// Service is the host's live view of what every sandbox is doing (the
// reaper's signals that only exist in memory: open streams, in-flight
// egress, the last API call), quota admission, and the counters /metrics
// exports. The reaper loop (reaper.go) folds the live signals into
// persisted ones every round.
type Service struct {
	core    Core
	cfg     Config
	started time.Time // the daemon's start: no sandbox is idle since before it

	mu   sync.Mutex
	live map[string]*LiveSignals

	// admitMu serialises quota check + insert of new sandboxes (quota.go).
	admitMu          sync.Mutex
	snapshotsPending map[string]int           // owner → captures in progress (under admitMu)
	startsPending    map[string]pendingStarts // owner → starts in progress (under admitMu)

	mMu           sync.Mutex
	creates       uint64
	createBuckets []uint64 // cumulative counts per createBounds entry
	createSum     float64
	rejections    map[string]uint64 // quota limit → count
	actions       map[[2]string]uint64
	rounds        uint64     // reaper rounds completed (roundcpu.go)
	lastRound     RoundStats // the last one's cost
}

// LiveSignals are one sandbox's in-memory activity signals.
type LiveSignals struct {
	Streams    int
	Egress     int
	LastClient time.Time
	LastAPI    time.Time
	LastEgress time.Time
}

// createBounds are the create-latency histogram's upper bounds, in seconds.
var createBounds = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}

// New builds the service; the core's clock now is the daemon's start.
func New(core Core, cfg Config) *Service {
	return &Service{core: core, cfg: cfg, started: core.Now(), live: map[string]*LiveSignals{},
		createBuckets: make([]uint64, len(createBounds)), rejections: map[string]uint64{}, actions: map[[2]string]uint64{},
		snapshotsPending: map[string]int{}, startsPending: map[string]pendingStarts{}}
}

func (a *Service) entry(id string) *LiveSignals {
	l, ok := a.live[id]
	if !ok {
		l = &LiveSignals{}
		a.live[id] = l
	}
	return l
}

// OpenStream records a client connected to sandbox id (an exec, attach,
// file or watch stream, or any in-flight request) until the returned
// function is called. The reaper never parks a sandbox with a client.
// id "" is a no-op.
func (a *Service) OpenStream(id string) (done func()) {
	if id == "" {
		return func() {}
	}
	now := a.core.Now()
	a.mu.Lock()
	l := a.entry(id)
	l.Streams++
	l.LastClient, l.LastAPI = now, now
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			l.Streams--
			l.LastClient = a.core.Now()
			a.mu.Unlock()
		})
	}
}

// OpenClientStream is OpenStream for a request made on behalf of owner ("" =
// admin): only a caller who may see the sandbox counts as its client, so
// another tenant's requests (refused anyway) cannot keep it awake.
func (a *Service) OpenClientStream(ctx context.Context, owner, id string) (done func()) {
	if id == "" {
		return func() {}
	}
	if _, err := a.core.Visible(ctx, owner, id); err != nil {
		return func() {}
	}
	return a.OpenStream(id)
}

// NoteEgress is the egress proxy's feed: inflight is the number of outbound
// requests of sandbox id in flight right now. A sandbox waiting on a long
// model call is busy, not idle.
func (a *Service) NoteEgress(id string, inflight int) {
	if id == "" || inflight < 0 {
		return
	}
	a.mu.Lock()
	l := a.entry(id)
	if inflight > 0 || l.Egress > 0 {
		l.LastEgress = a.core.Now()
	}
	l.Egress = inflight
	a.mu.Unlock()
}

// NoteAPI records an API call that touched sandbox id.
func (a *Service) NoteAPI(id string) {
	a.mu.Lock()
	a.entry(id).LastAPI = a.core.Now()
	a.mu.Unlock()
}

// Live copies the live signals of id.
func (a *Service) Live(id string) LiveSignals {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.live[id]; ok {
		return *l
	}
	return LiveSignals{}
}

// prune drops live entries of sandboxes that no longer exist, unless a
// stream or request is still open on them.
func (a *Service) prune(exists func(id string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.live {
		if !exists(id) && l.Streams == 0 && l.Egress == 0 {
			delete(a.live, id)
		}
	}
}

// ObserveCreate counts a create that became ready after d.
func (a *Service) ObserveCreate(d time.Duration) {
	a.mMu.Lock()
	defer a.mMu.Unlock()
	a.creates++
	s := d.Seconds()
	a.createSum += s
	for i, b := range createBounds {
		if s <= b {
			a.createBuckets[i]++
		}
	}
}

func (a *Service) observeRejection(limit string) {
	a.mMu.Lock()
	a.rejections[limit]++
	a.mMu.Unlock()
}

func (a *Service) observeAction(action, reason string) {
	a.mMu.Lock()
	a.actions[[2]string{action, reason}]++
	a.mMu.Unlock()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

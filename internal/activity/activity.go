// Package activity owns each sandbox's activity timeline: one ordered,
// bounded stream of what happened inside and around a sandbox — its
// lifecycle events, every exec through the API (argv, user, cwd, start,
// end, exit code or signal, bytes in/out, pid), file changes through the
// API and sampled in the workspace, egress decisions, pauses and resumes
// with their mode, reaper decisions with their signals.
//
// Lifecycle events and egress decisions already have their storage (the
// events and egress_log tables): they join the timeline in the store (a
// pointer row added in their own transaction) and are summarized here on
// read. What only this package sees — execs and file changes — is
// recorded through a bounded queue that one writer drains in batches, so
// the exec path never waits on SQLite: when the queue is full an entry is
// dropped and counted, and the count becomes a "dropped" entry of its
// sandbox. The writer keeps every sandbox's newest Config.Retention
// entries (pruning after each batch the sandboxes that got new entries);
// deleting a sandbox deletes its timeline (a store trigger).
//
// Lock: Service.mu is a leaf (the live execs, dropped counts and waiters).
package activity

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the service needs of the lifecycle core.
type Core interface {
	// Visible loads a sandbox, NotFound for another owner's ("" = admin).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Running lists the running sandboxes (the workspace sampler's).
	Running(ctx context.Context) ([]*sandbox.Sandbox, error)
	// UpperDir is the host path of a sandbox's overlay upper directory.
	UpperDir(id string) string
}

// Store is the part of the store the timeline lives in.
type Store interface {
	AppendActivity(ctx context.Context, entries []store.ActivityEntry) error
	ListActivity(ctx context.Context, f store.ActivityFilter) ([]store.ActivityEntry, error)
	PruneActivity(ctx context.Context, sandboxID string, keep int) (int64, error)
	ActivityTouched(ctx context.Context, afterSeq int64) (map[string]int64, int64, error)
}

// Defaults of Config.
const (
	DefaultRetention = 10000
	DefaultQueue     = 8192
	// maxBatch bounds one transaction of the writer.
	maxBatch = 1024
	// sweepEvery is how often the writer prunes the sandboxes with new
	// entries (its own and those the store added: events, egress) and
	// announces the latter: a timeline exceeds its bound by at most what
	// arrives in that time.
	sweepEvery = 250 * time.Millisecond
	// linger is how long a batch waits for more entries after its first.
	linger = 20 * time.Millisecond
)

// Config configures a Service; zero fields take the defaults.
type Config struct {
	Retention int // entries kept per sandbox (berth serve --activity-retention)
	Queue     int // entries waiting for the writer before new ones are dropped
	Log       *slog.Logger
	Now       func() time.Time
}

// Service records and serves the activity timelines.
type Service struct {
	cfg   Config
	core  Core
	store Store
	queue chan pending

	mu      sync.Mutex
	dropped map[string]int64           // per sandbox, not yet reported
	waiters map[string][]chan struct{} // closed when the sandbox gets entries
	live    map[liveKey]*execTrace     // running execs, for stdin byte counts
	nudged  map[string]struct{}        // sandboxes with entries recorded since the sampler's last tick

	debt map[string]int64 // entries added since a sandbox's last pruning (the writer's own)
}

type liveKey struct {
	id  string
	pid int
}

// New returns a service; Run starts its writer.
func New(cfg Config, core Core, st Store) *Service {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, core: core, store: st, queue: make(chan pending, cfg.Queue),
		dropped: map[string]int64{}, waiters: map[string][]chan struct{}{}, live: map[liveKey]*execTrace{}, debt: map[string]int64{},
		nudged: map[string]struct{}{}}
}

// Retention is how many entries a sandbox keeps.
func (s *Service) Retention() int { return s.cfg.Retention }

// pending is a recorded entry waiting for the writer (encoded there, off
// the exec path).
type pending struct {
	id, kind, actor string
	at              time.Time
	d               Data
}

// Record queues an entry of a recorded kind (exec, file, ...); it never
// blocks: with the queue full the entry is dropped and counted. It also
// tells the workspace sampler that the sandbox is in use (workspace.go).
func (s *Service) Record(id, kind, actor string, at time.Time, d Data) {
	s.mu.Lock()
	s.nudged[id] = struct{}{}
	s.mu.Unlock()
	s.record(id, kind, actor, at, d)
}

// takeNudged returns, and forgets, the sandboxes with entries recorded
// since the last call.
func (s *Service) takeNudged() map[string]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nudged
	if len(n) > 0 {
		s.nudged = map[string]struct{}{}
	}
	return n
}

func (s *Service) record(id, kind, actor string, at time.Time, d Data) {
	select {
	case s.queue <- pending{id: id, kind: kind, actor: actor, at: at, d: d}:
	default:
		s.mu.Lock()
		s.dropped[id]++
		s.mu.Unlock()
	}
}

// Run drains the queue until ctx ends, then writes what is left. A batch
// is what arrives within linger of its first entry (at most maxBatch):
// one transaction for many execs, and a follower still sees an entry
// within linger plus one write.
func (s *Service) Run(ctx context.Context) {
	sampled := make(chan struct{})
	go func() { defer close(sampled); s.sample(ctx) }()
	defer func() { <-sampled }()
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	wctx := context.WithoutCancel(ctx)
	var swept int64
	batch := make([]pending, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			s.drain(batch)
			return
		case e := <-s.queue:
			batch = s.linger(ctx, append(batch, e))
			s.write(wctx, s.withDrops(batch))
		case <-tick.C:
			// Drops are reported even when nothing else gets through, and
			// entries the store added by itself (events, egress) are
			// pruned and announced here.
			s.write(wctx, s.withDrops(batch))
			swept = s.sweep(wctx, swept)
		}
	}
}

// linger adds what arrives within linger of the batch's first entry.
func (s *Service) linger(ctx context.Context, batch []pending) []pending {
	t := time.NewTimer(linger)
	defer t.Stop()
	for len(batch) < maxBatch {
		select {
		case e := <-s.queue:
			batch = append(batch, e)
		case <-t.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// withDrops adds one "dropped" entry per sandbox that lost entries.
func (s *Service) withDrops(batch []pending) []pending {
	s.mu.Lock()
	drops := s.dropped
	if len(drops) > 0 {
		s.dropped = map[string]int64{}
	}
	s.mu.Unlock()
	now := s.cfg.Now()
	for id, n := range drops {
		batch = append(batch, pending{id: id, kind: KindDropped, actor: "berth", at: now, d: Data{Dropped: n}})
	}
	return batch
}

func (s *Service) drain(batch []pending) {
	for len(batch) < cap(batch) {
		select {
		case e := <-s.queue:
			batch = append(batch, e)
			continue
		default:
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.write(ctx, s.withDrops(batch))
}

func (s *Service) write(ctx context.Context, batch []pending) {
	if len(batch) == 0 {
		return
	}
	rows := make([]store.ActivityEntry, 0, len(batch))
	for _, p := range batch {
		b, err := json.Marshal(p.d)
		if err != nil {
			s.cfg.Log.Error("encode activity", "sandbox_id", p.id, "err", err)
			continue
		}
		rows = append(rows, store.ActivityEntry{SandboxID: p.id, Time: p.at, Kind: p.kind, Actor: p.actor,
			Summary: Summarize(p.kind, p.d), Data: b})
	}
	if err := s.store.AppendActivity(ctx, rows); err != nil {
		s.cfg.Log.Error("write activity", "entries", len(rows), "err", err)
		return
	}
	woken := map[string]bool{}
	for _, p := range batch {
		if !woken[p.id] {
			woken[p.id] = true
			s.wake(p.id)
		}
	}
}

// sweep prunes the sandboxes with entries after seq and wakes their
// followers. Pruning costs a walk over the sandbox's newest Retention
// index entries, so a sandbox is pruned once it has gained a tenth of its
// retention since its last pruning, or when it has gone quiet (a sweep
// with no new entries) with any gain: a busy timeline exceeds its bound by
// at most a tenth plus one sweep's arrivals, and a quiet one is exact.
func (s *Service) sweep(ctx context.Context, seq int64) int64 {
	touched, last, err := s.store.ActivityTouched(ctx, seq)
	if err != nil {
		s.cfg.Log.Error("activity sweep", "err", err)
		return seq
	}
	for id, n := range touched {
		s.debt[id] += n
		s.wake(id)
	}
	step := max(int64(s.cfg.Retention/10), 1)
	for id, d := range s.debt {
		if _, busy := touched[id]; busy && d < step {
			continue
		}
		if _, err := s.store.PruneActivity(ctx, id, s.cfg.Retention); err != nil {
			s.cfg.Log.Error("prune activity", "sandbox_id", id, "err", err)
			continue
		}
		delete(s.debt, id)
	}
	return last
}

// changed returns a channel closed when the sandbox next gets entries.
func (s *Service) changed(id string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[id] = append(s.waiters[id], ch)
	s.mu.Unlock()
	return ch
}

func (s *Service) wake(id string) {
	s.mu.Lock()
	ws := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	for _, ch := range ws {
		close(ch)
	}
}

func (s *Service) forget(id string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[id]
	for i, w := range ws {
		if w == ch {
			s.waiters[id] = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(s.waiters[id]) == 0 {
		delete(s.waiters, id)
	}
}

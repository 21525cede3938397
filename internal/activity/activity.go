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
}

// Store is the part of the store the timeline lives in.
type Store interface {
	AppendActivity(ctx context.Context, entries []store.ActivityEntry) error
	ListActivity(ctx context.Context, f store.ActivityFilter) ([]store.ActivityEntry, error)
	PruneActivity(ctx context.Context, sandboxID string, keep int) (int64, error)
	ActivityTouched(ctx context.Context, afterSeq int64) ([]string, int64, error)
}

// Defaults of Config.
const (
	DefaultRetention = 10000
	DefaultQueue     = 8192
	// maxBatch bounds one transaction of the writer.
	maxBatch = 1024
	// sweepEvery is how often the writer looks for entries the store
	// added by itself (events, egress) to prune and announce them.
	sweepEvery = 250 * time.Millisecond
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
	queue chan store.ActivityEntry

	mu      sync.Mutex
	dropped map[string]int64           // per sandbox, not yet reported
	waiters map[string][]chan struct{} // closed when the sandbox gets entries
	live    map[liveKey]*execTrace     // running execs, for stdin byte counts
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
	return &Service{cfg: cfg, core: core, store: st, queue: make(chan store.ActivityEntry, cfg.Queue),
		dropped: map[string]int64{}, waiters: map[string][]chan struct{}{}, live: map[liveKey]*execTrace{}}
}

// Retention is how many entries a sandbox keeps.
func (s *Service) Retention() int { return s.cfg.Retention }

// Record queues an entry of a recorded kind (exec, file, ...); it never
// blocks: with the queue full the entry is dropped and counted.
func (s *Service) Record(id, kind, actor string, at time.Time, d Data) {
	b, err := json.Marshal(d)
	if err != nil {
		s.cfg.Log.Error("encode activity", "sandbox_id", id, "err", err)
		return
	}
	e := store.ActivityEntry{SandboxID: id, Time: at, Kind: kind, Actor: actor, Summary: Summarize(kind, d), Data: b}
	select {
	case s.queue <- e:
	default:
		s.mu.Lock()
		s.dropped[id]++
		s.mu.Unlock()
	}
}

// Run drains the queue until ctx ends, then writes what is left.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	var swept int64
	batch := make([]store.ActivityEntry, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			s.drain(batch)
			return
		case e := <-s.queue:
			batch = append(batch, e)
		case <-tick.C:
		}
		batch = s.fill(batch)
		s.write(context.WithoutCancel(ctx), batch)
		swept = s.sweep(context.WithoutCancel(ctx), swept)
	}
}

// fill adds what is queued (without waiting) and the dropped counts.
func (s *Service) fill(batch []store.ActivityEntry) []store.ActivityEntry {
	for len(batch) < maxBatch {
		select {
		case e := <-s.queue:
			batch = append(batch, e)
			continue
		default:
		}
		break
	}
	s.mu.Lock()
	drops := s.dropped
	if len(drops) > 0 {
		s.dropped = map[string]int64{}
	}
	s.mu.Unlock()
	now := s.cfg.Now()
	for id, n := range drops {
		d := Data{Dropped: n}
		b, _ := json.Marshal(d)
		batch = append(batch, store.ActivityEntry{SandboxID: id, Time: now, Kind: KindDropped, Actor: "berth",
			Summary: Summarize(KindDropped, d), Data: b})
	}
	return batch
}

func (s *Service) drain(batch []store.ActivityEntry) {
	batch = s.fill(batch)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.write(ctx, batch)
}

func (s *Service) write(ctx context.Context, batch []store.ActivityEntry) {
	if len(batch) == 0 {
		return
	}
	if err := s.store.AppendActivity(ctx, batch); err != nil {
		s.cfg.Log.Error("write activity", "entries", len(batch), "err", err)
	}
}

// sweep prunes and announces every sandbox with entries after seq.
func (s *Service) sweep(ctx context.Context, seq int64) int64 {
	ids, last, err := s.store.ActivityTouched(ctx, seq)
	if err != nil {
		s.cfg.Log.Error("activity sweep", "err", err)
		return seq
	}
	for _, id := range ids {
		if _, err := s.store.PruneActivity(ctx, id, s.cfg.Retention); err != nil {
			s.cfg.Log.Error("prune activity", "sandbox_id", id, "err", err)
		}
		s.wake(id)
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

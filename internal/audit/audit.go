// Package audit owns berth's audit chain (docs/AUDIT.md): an append-only,
// hash-chained log of every API action (who, what route, which sandbox,
// the outcome), every exec's command line, the lifecycle moments of
// internal/statehook (pause, resume, fork with its parent, restore, stop),
// egress verdicts, and what the other state services report through their
// Auditor (approvals, side effects, leases).
//
// Callers never wait on the store: Audit and Record put an entry on a
// bounded queue that one writer drains in batches (one transaction each);
// when the queue is full the entry is dropped and counted, and the count
// becomes an `audit.dropped` entry — never silently. The writer gives each
// entry its seq, prev_hash and hash = SHA-256(prev_hash ‖ Canonical(entry)),
// and a MAC under the audit key (DATA_DIR/audit.key, 0600) over (seq,
// hash); the batch's last link is the head, stored in the batch's
// transaction and then in the head file (DATA_DIR/audit.head). Verify walks
// the chain and compares its end with both heads: a changed, removed or
// reordered entry and a truncated tail are reported by seq.
//
// Entries are never deleted (not with their sandbox) and never rolled back
// (a rewind appends). Lock: Service.mu is a leaf (the dropped count and the
// owner cache); the writer's chain state is the writer goroutine's own.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the service needs of the lifecycle core.
type Core interface {
	// SandboxOwner is the owner of a sandbox ("" and an error if unknown).
	SandboxOwner(ctx context.Context, id string) (string, error)
}

// Store is the part of the store the chain lives in.
type Store interface {
	AppendAudit(ctx context.Context, entries []store.AuditEntry, head store.AuditHead) error
	AuditHead(ctx context.Context) (store.AuditHead, error)
	AuditLast(ctx context.Context) (store.AuditEntry, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error)
}

// Files in the data dir.
const (
	KeyFile  = "audit.key"
	KeySize  = 32
	HeadFile = "audit.head"
)

// Defaults of Config.
const (
	DefaultQueue = 8192
	maxBatch     = 512
	linger       = 10 * time.Millisecond
	ownerCache   = 4096
)

// Actions the service itself writes.
const (
	ActionDropped  = "audit.dropped"  // data: count (entries lost to a full queue or a failed write)
	ActionMismatch = "audit.mismatch" // at start the stored chain's end disagreed with its heads; data: problems
)

// Config configures a Service.
type Config struct {
	Key      []byte // the audit key (KeyFile's content)
	HeadPath string // the head file; "" = none (unit tests)
	Queue    int
	Log      *slog.Logger
	Now      func() time.Time
}

// Entry is what a caller records. Owner "" is resolved from SandboxID
// by the writer.
type Entry struct {
	Time      time.Time
	Actor     string
	Action    string
	SandboxID string
	Owner     string
	Data      map[string]string
}

// Service is the audit chain.
type Service struct {
	cfg   Config
	core  Core
	store Store
	queue chan pending

	mu      sync.Mutex
	dropped int64
	owners  map[string]string
}

// pending is a queued entry, or (flush != nil) a marker closed once every
// entry queued before it is written.
type pending struct {
	e     Entry
	flush chan struct{}
}

// New returns a service; Run starts its writer.
func New(cfg Config, core Core, st Store) *Service {
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, core: core, store: st, queue: make(chan pending, cfg.Queue), owners: map[string]string{}}
}

// Audit records an entry (docs/STATE.md's Auditor): actor is a principal
// or "berth", action a dotted verb. It never blocks.
func (s *Service) Audit(ctx context.Context, actor, action, sandboxID string, data map[string]string) {
	s.Record(Entry{Actor: actor, Action: action, SandboxID: sandboxID, Data: data})
}

// Record queues e; with the queue full it is counted as dropped. A nil
// Service records nothing (unit tests of other packages).
func (s *Service) Record(e Entry) {
	if s == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = s.cfg.Now()
	}
	select {
	case s.queue <- pending{e: e}:
	default:
		s.mu.Lock()
		s.dropped++
		s.mu.Unlock()
	}
}

// Flush waits until every entry queued before it is in the store (or ctx
// ends). Tests and `audit verify` use it; the request paths never do.
func (s *Service) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case s.queue <- pending{flush: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// chain is the writer's view of the stored chain's end.
type chain struct {
	seq  int64
	hash string
}

// Run writes queued entries until ctx ends, then what is left.
func (s *Service) Run(ctx context.Context) {
	wctx := context.WithoutCancel(ctx)
	c, problems := s.open(wctx)
	if len(problems) > 0 {
		// The end of the stored chain disagrees with its heads (rows were
		// removed, or a head was edited): the writer continues from the
		// stored rows, and the finding is itself an entry of the chain, so
		// appending cannot hide it (Verify reports it for good).
		d := map[string]string{"problems": strconv.Itoa(len(problems))}
		for i, p := range problems {
			if i >= 8 {
				break
			}
			d["problem_"+strconv.Itoa(i+1)] = p.Message
		}
		s.cfg.Log.Error("audit chain: the stored end disagrees with its head", "problems", len(problems), "first", problems[0].Message)
		c = s.write(wctx, c, []pending{{e: Entry{Time: s.cfg.Now(), Actor: "berth", Action: ActionMismatch, Data: d}}})
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	batch := make([]pending, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			batch = s.drainQueue(batch)
			c = s.write(wctx, c, s.withDrops(batch))
			return
		case p := <-s.queue:
			batch = s.linger(ctx, append(batch, p))
			c = s.write(wctx, c, s.withDrops(batch))
		case <-tick.C:
			c = s.write(wctx, c, s.withDrops(batch))
		}
	}
}

func (s *Service) linger(ctx context.Context, batch []pending) []pending {
	t := time.NewTimer(linger)
	defer t.Stop()
	for len(batch) < maxBatch {
		select {
		case p := <-s.queue:
			batch = append(batch, p)
		case <-t.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

func (s *Service) drainQueue(batch []pending) []pending {
	for {
		select {
		case p := <-s.queue:
			batch = append(batch, p)
		default:
			return batch
		}
	}
}

// withDrops appends an audit.dropped entry when entries were lost.
func (s *Service) withDrops(batch []pending) []pending {
	s.mu.Lock()
	n := s.dropped
	s.dropped = 0
	s.mu.Unlock()
	if n == 0 {
		return batch
	}
	return append(batch, pending{e: Entry{Time: s.cfg.Now(), Actor: "berth", Action: ActionDropped,
		Data: map[string]string{"count": strconv.FormatInt(n, 10)}}})
}

// open reads the stored chain's end and checks it against the heads.
func (s *Service) open(ctx context.Context) (chain, []Problem) {
	heads := s.readHeads(ctx)
	last, err := s.store.AuditLast(ctx)
	c := chain{hash: Genesis}
	if err == nil {
		c = chain{seq: last.Seq, hash: last.Hash}
	} else if !errs.Is(err, errs.NotFound) {
		s.cfg.Log.Error("audit chain: read its end", "err", err)
	}
	problems := s.checkHeads(ctx, heads, c)
	if c.seq > 0 && len(problems) == 0 {
		// A crash between the commit and the head file leaves the file
		// behind the store: bring it up to date.
		s.writeHead(store.AuditHead{Seq: c.seq, Hash: c.hash, MAC: MAC(s.cfg.Key, c.seq, c.hash)})
	}
	return c, problems
}

// write hashes and stores the batch's entries after c and returns the new
// end; flush markers are released once their predecessors are stored.
func (s *Service) write(ctx context.Context, c chain, batch []pending) chain {
	var flushes []chan struct{}
	defer func() {
		for _, f := range flushes {
			close(f)
		}
	}()
	rows := make([]store.AuditEntry, 0, len(batch))
	next := c
	for _, p := range batch {
		if p.flush != nil {
			flushes = append(flushes, p.flush)
			continue
		}
		e := p.e
		row := store.AuditEntry{Seq: next.seq + 1, Time: e.Time.UTC(), Actor: clip(e.Actor, MaxField),
			Action: clip(e.Action, MaxField), SandboxID: clip(e.SandboxID, MaxField), Data: bound(e.Data)}
		row.Owner = clip(e.Owner, MaxField)
		if row.Owner == "" && row.SandboxID != "" {
			row.Owner = clip(s.owner(ctx, row.SandboxID), MaxField)
		}
		row.PrevHash = next.hash
		row.Hash = Hash(row.PrevHash, row)
		row.MAC = MAC(s.cfg.Key, row.Seq, row.Hash)
		rows = append(rows, row)
		next = chain{seq: row.Seq, hash: row.Hash}
	}
	if len(rows) == 0 {
		return c
	}
	head := store.AuditHead{Seq: next.seq, Hash: next.hash, MAC: MAC(s.cfg.Key, next.seq, next.hash)}
	if err := s.store.AppendAudit(ctx, rows, head); err != nil {
		// Lost, but counted: the next batch carries an audit.dropped
		// entry. The chain's end is read again in case the store moved.
		s.cfg.Log.Error("audit chain: write", "entries", len(rows), "err", err)
		s.mu.Lock()
		s.dropped += int64(len(rows))
		s.mu.Unlock()
		if last, err := s.store.AuditLast(ctx); err == nil {
			return chain{seq: last.Seq, hash: last.Hash}
		}
		return c
	}
	s.writeHead(head)
	return next
}

// owner resolves a sandbox's owner (cached: an owner never changes).
func (s *Service) owner(ctx context.Context, id string) string {
	s.mu.Lock()
	o, ok := s.owners[id]
	s.mu.Unlock()
	if ok {
		return o
	}
	o, err := s.core.SandboxOwner(ctx, id)
	if err != nil {
		return ""
	}
	s.mu.Lock()
	if len(s.owners) >= ownerCache {
		s.owners = map[string]string{}
	}
	s.owners[id] = o
	s.mu.Unlock()
	return o
}

// headFile is the head file's content.
type headFile struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
	MAC  string `json:"mac"`
}

// writeHead replaces the head file atomically (a temp file, fsync,
// rename); a failure is logged (verify then reports the file behind).
func (s *Service) writeHead(h store.AuditHead) {
	if s.cfg.HeadPath == "" {
		return
	}
	b, _ := json.Marshal(headFile(h))
	tmp := s.cfg.HeadPath + ".tmp"
	err := func() error {
		_ = os.Remove(tmp)
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(append(b, '\n'))
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return os.Rename(tmp, s.cfg.HeadPath)
	}()
	if err != nil {
		s.cfg.Log.Error("audit chain: write head file", "path", s.cfg.HeadPath, "err", err)
	}
}

// readHead reads the head file; ok is false when it does not exist.
func readHead(path string) (store.AuditHead, bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return store.AuditHead{}, false, nil
	}
	if err != nil {
		return store.AuditHead{}, false, err
	}
	defer f.Close()
	var h headFile
	dec := json.NewDecoder(io.LimitReader(f, 4096))
	if err := dec.Decode(&h); err != nil {
		return store.AuditHead{}, true, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return store.AuditHead(h), true, nil
}

// List returns matching entries, oldest first (the caller scopes it to
// what its principal may see).
func (s *Service) List(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error) {
	return s.store.ListAudit(ctx, f)
}

// Package notes owns handoff notes (issue 17, docs/NOTES.md): what berth
// writes outside a sandbox when it is paused or stopped, and on demand —
// the files changed since the previous note, the git state of the
// workspace's repositories, the processes that were running, and what the
// agent supplies (why it stopped, what is unfinished, the next step, the
// version of its model context). A note is returned on resume and
// connect, inherited by a fork, and replaced by the note of the point a
// restore goes back to, with a desync warning when the agent's context is
// newer than the machine.
//
// It keeps its notes in the store (never in a sandbox-writable tree) and
// holds one leaf lock per sandbox only while appending, so two writers of
// one sandbox's notes diff against each other in order.
package notes

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what notes need of the lifecycle core (daemon.notesCore).
type Core interface {
	// Visible loads a sandbox, hiding other owners' behind NotFound.
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Tree is a running sandbox's tree as of about now (its live upper
	// over its layers) and how many of its top layers are the sandbox's
	// own (above its template's); release frees it.
	Tree(ctx context.Context, sb *sandbox.Sandbox) (tree *fsdiff.Tree, own int, release func() error, err error)
	// Agent is a running sandbox's agent client (never resumes it).
	Agent(sb *sandbox.Sandbox) *agentapi.Client
}

// Config configures the service.
type Config struct {
	Log *slog.Logger
	Now func() time.Time
	// Budget bounds a note's collection (default Budget).
	Budget time.Duration
}

// Service writes and reads handoff notes.
type Service struct {
	core  Core
	store store.NoteStore
	cfg   Config

	mu      sync.Mutex // leaf: guards locks and buckets
	locks   map[string]*noteLock
	buckets map[string]bucket // demand-note rate per sandbox
}

// New builds the service.
func New(core Core, st store.NoteStore, cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Budget <= 0 {
		cfg.Budget = Budget
	}
	return &Service{core: core, store: st, cfg: cfg, locks: map[string]*noteLock{}, buckets: map[string]bucket{}}
}

// lock takes the sandbox's note lock, waiting no longer than ctx: a pause
// must not wait behind a slow on-demand note past its own budget.
func (s *Service) lock(ctx context.Context, id string) (func(), error) {
	s.mu.Lock()
	l, ok := s.locks[id]
	if !ok {
		l = &noteLock{ch: make(chan struct{}, 1)}
		s.locks[id] = l
	}
	l.users++
	s.mu.Unlock()
	release := func() {
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, id) // no entry outlives its last user
		}
		s.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, errs.E(errs.Unavailable, "another note of sandbox %s is being written", id)
	}
}

type noteLock struct {
	ch    chan struct{} // holds one token while a note is written
	users int           // guarded by Service.mu
}

// Demand notes a sandbox asks for from inside are rate-limited per
// sandbox: a bucket of demandBurst, refilled one per demandEvery.
const (
	demandBurst = 10
	demandEvery = 6 * time.Second
)

// bucket is a token bucket's state; take is its pure rule.
type bucket struct {
	tokens float64
	at     time.Time
}

func (b bucket) take(now time.Time) (bucket, bool) {
	if b.at.IsZero() {
		b = bucket{tokens: demandBurst, at: now}
	}
	if now.After(b.at) {
		b.tokens = min(demandBurst, b.tokens+float64(now.Sub(b.at))/float64(demandEvery))
		b.at = now
	}
	if b.tokens < 1 {
		return b, false
	}
	b.tokens--
	return b, true
}

func (s *Service) allowDemand(id string) bool {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buckets) >= 4096 { // forget the full ones (they would allow anyway)
		for k, b := range s.buckets {
			if now.Sub(b.at) > demandBurst*demandEvery {
				delete(s.buckets, k)
			}
		}
	}
	b, ok := s.buckets[id].take(now)
	s.buckets[id] = b
	return ok
}

// Current is a sandbox's newest note and its desync (nil, nil: none yet).
type Current struct {
	Note   *Note
	Desync *Desync
}

// Latest is the newest note of a sandbox owner sees, with its desync.
func (s *Service) Latest(ctx context.Context, owner, id string) (Current, error) {
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return Current{}, err
	}
	return s.current(ctx, id)
}

func (s *Service) current(ctx context.Context, id string) (Current, error) {
	list, _, err := s.recent(ctx, id, keptManifests)
	if err != nil || len(list) == 0 {
		return Current{}, err
	}
	return Current{Note: &list[0], Desync: CurrentDesync(list)}, nil
}

// List is a sandbox's notes, newest first.
func (s *Service) List(ctx context.Context, owner, id string) ([]Note, error) {
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	list, _, err := s.recent(ctx, id, 0)
	return list, err
}

// Get is one note by seq.
func (s *Service) Get(ctx context.Context, owner, id string, seq int64) (*Note, error) {
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	row, err := s.store.GetNote(ctx, id, seq)
	if err != nil {
		return nil, err
	}
	n, err := decode(row)
	return &n, err
}

// recent decodes a sandbox's newest notes (limit 0: all) and returns the
// newest manifest among them with the seq of its note.
func (s *Service) recent(ctx context.Context, id string, limit int) ([]Note, *manifestAt, error) {
	rows, err := s.store.ListNotes(ctx, id, limit)
	if err != nil {
		return nil, nil, err
	}
	out := make([]Note, 0, len(rows))
	var man *manifestAt
	for _, r := range rows {
		n, err := decode(r)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, n)
		if man == nil && r.Manifest != nil {
			var m Manifest
			if json.Unmarshal(r.Manifest, &m) == nil {
				man = &manifestAt{seq: r.Seq, m: &m}
			}
		}
	}
	return out, man, nil
}

type manifestAt struct {
	seq int64
	m   *Manifest
}

func decode(r store.Note) (Note, error) {
	var n Note
	if err := json.Unmarshal(r.Body, &n); err != nil {
		return Note{}, errs.Wrap(errs.Internal, err, "note %d of sandbox %s does not decode", r.Seq, r.Sandbox)
	}
	n.Sandbox, n.Seq, n.Trigger, n.CreatedAt = r.Sandbox, r.Seq, r.Trigger, r.CreatedAt
	return n, nil
}

// append stores n (and its manifest) as the sandbox's newest note.
func (s *Service) append(ctx context.Context, sb *sandbox.Sandbox, n Note, m *Manifest) (*Note, error) {
	n.Sandbox = sb.ID
	if n.CreatedAt.IsZero() {
		n.CreatedAt = s.cfg.Now().UTC()
	}
	body, err := json.Marshal(n)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "encode note")
	}
	var man []byte
	if m != nil {
		if man, err = json.Marshal(m); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "encode manifest")
		}
	}
	row, err := s.store.AppendNote(context.WithoutCancel(ctx), store.Note{Sandbox: sb.ID, Owner: sb.Owner, Trigger: n.Trigger,
		CreatedAt: n.CreatedAt, At: n.CreatedAt, Body: body, Manifest: man}, Retained, keptManifests)
	if err != nil {
		return nil, err
	}
	n.Seq = row.Seq
	return &n, nil
}

// WriteRequest asks for a note on demand.
type WriteRequest struct {
	Owner, Sandbox, Actor string
	Supplied
	// FromSandbox: the sandbox itself asks (the in-sandbox API), so the
	// rate of its requests is bounded (demandBurst, then one per demandEvery).
	FromSandbox bool
}

// Write writes a note of the sandbox owner sees now (on demand), with
// what the caller supplies. A running sandbox's machine state is
// collected (bounded by the budget); a sandbox that is not running gets
// a note of the supplied fields only.
func (s *Service) Write(ctx context.Context, req WriteRequest) (*Note, error) {
	sup, id := req.Supplied, req.Sandbox
	if err := sup.Validate(); err != nil {
		return nil, err
	}
	sb, err := s.core.Visible(ctx, req.Owner, id)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case sandbox.Running, sandbox.Paused, sandbox.Stopped:
	default:
		return nil, errs.E(errs.FailedPrecondition, "sandbox %s is %s: a note is written while it is running, paused or stopped", id, sb.State)
	}
	if req.FromSandbox && !s.allowDemand(id) {
		return nil, errs.E(errs.ResourceExhausted, "sandbox %s: at most %d notes on demand in a row, then one every %s", id, demandBurst, demandEvery)
	}
	return s.write(ctx, sb, TriggerDemand, req.Actor, sup, true)
}

// write collects and appends one note. supplied says the caller supplied
// sup (an automatic note carries the previous note's fields forward).
func (s *Service) write(ctx context.Context, sb *sandbox.Sandbox, trigger, actor string, sup Supplied, supplied bool) (_ *Note, err error) {
	started := time.Now()
	ph := phases.Start("note")
	defer func() { ph.Log(ctx, s.cfg.Log, sb.ID, err) }()
	unlock, err := s.lock(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ph.Mark("lock")
	var procs <-chan listed
	if sb.State == sandbox.Running {
		// The agent lists the processes while the notes are read and the
		// upper is scanned: the three are independent, and the agent's
		// round trip was a sixth of a note.
		procs = s.listProcesses(ctx, sb, started.Add(s.cfg.Budget))
	}
	prev, man, err := s.recent(ctx, sb.ID, keptManifests)
	if err != nil {
		return nil, err
	}
	ph.Mark("recent")
	n := Note{Trigger: trigger, Actor: actor}
	if len(prev) > 0 {
		last := prev[0]
		// The context version the agent last declared stays the note's
		// until it declares another; so does a desync it has not answered.
		// So do what is unfinished and the next step, until given anew;
		// the reason is each note's own.
		n.ContextVersion, n.Desync = last.ContextVersion, last.Desync
		n.Unfinished, n.Next = last.Unfinished, last.Next
	}
	if supplied {
		n.Reason = sup.Reason
		if sup.Unfinished != "" {
			n.Unfinished = sup.Unfinished
		}
		if sup.Next != "" {
			n.Next = sup.Next
		}
		if sup.ContextVersion != "" {
			n.ContextVersion, n.Desync = sup.ContextVersion, nil
		}
	}
	var m *Manifest
	if sb.State == sandbox.Running {
		cctx, cancel := context.WithDeadline(ctx, started.Add(s.cfg.Budget))
		m = s.collect(cctx, sb, &n, man, procs, ph)
		cancel()
	} else {
		n.Files.Error = "sandbox is " + string(sb.State) + ": machine state not collected"
	}
	n.Millis = time.Since(started).Milliseconds()
	defer ph.Mark("append")
	return s.append(ctx, sb, n, m)
}

// collect fills in the machine state of a running sandbox and returns
// its manifest (nil if the files could not be read). Each part that
// fails or runs out of time says so in the note; none fails it.
func (s *Service) collect(ctx context.Context, sb *sandbox.Sandbox, n *Note, prev *manifestAt, procs <-chan listed, ph *phases.Timer) *Manifest {
	n.Collected = true
	ag := s.core.Agent(sb)
	var repos []repoAt
	var m *Manifest
	func() {
		// The files get what is left but a share kept for git.
		fctx := ctx
		if dl, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithDeadline(ctx, dl.Add(-time.Until(dl)/3))
			defer cancel()
		}
		tree, own, release, err := s.core.Tree(fctx, sb)
		if err != nil {
			n.Files.Error = errs.Short(err)
			return
		}
		defer func() { _ = release() }()
		ph.Mark("tree")
		mm, rs, err := scanTree(fctx, tree, own)
		repos = rs
		if err != nil {
			n.Files.Error = "workspace scan cut short: " + errs.Short(err)
			mm.Truncated = true
		}
		m = mm
	}()
	if m != nil {
		var pm *Manifest
		since := int64(0)
		if prev != nil {
			pm, since = prev.m, prev.seq
		}
		errText := n.Files.Error
		n.Files = Changes(pm, m, MaxFiles)
		n.Files.SinceSeq, n.Files.Error = since, errText
	}
	ph.Mark("scan")
	p := <-procs
	n.Processes, n.ProcError = p.procs, p.err
	ph.Mark("processes_wait")
	n.ReposTotal = len(repos)
	if len(repos) > MaxRepos {
		repos = repos[:MaxRepos]
	}
	if len(repos) > 0 {
		if ag == nil {
			n.GitError = "no agent channel"
		} else {
			rs, err := gitState(ctx, ag, repos)
			n.Repos = rs
			if err != nil {
				n.GitError = errs.Short(err)
			}
		}
		ph.Mark("git")
	}
	return m
}

// listed is the agent's process list for a note, or why there is none.
type listed struct {
	procs []Process
	err   string
}

// listProcesses asks sb's agent for its processes (at most 300 ms, and
// not past deadline) and delivers the answer on the channel it returns.
func (s *Service) listProcesses(ctx context.Context, sb *sandbox.Sandbox, deadline time.Time) <-chan listed {
	out := make(chan listed, 1)
	ag := s.core.Agent(sb)
	if ag == nil {
		out <- listed{err: "no agent channel"}
		return out
	}
	go func() {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		pctx, pcancel := context.WithTimeout(dctx, 300*time.Millisecond)
		defer pcancel()
		procs, err := processes(pctx, ag)
		l := listed{procs: procs}
		if err != nil {
			l.err = errs.Short(err)
		}
		out <- l
	}()
	return out
}

// OnState is the notes' row of the state table (docs/STATE.md): a note on
// pause and stop, inherited on fork, the point's note on restore.
func (s *Service) OnState(ctx context.Context, ev statehook.Event) error {
	if ev.Sandbox == nil {
		return nil
	}
	// A pause or a stop waits at most the budget, the wait for the note
	// lock included.
	switch ev.Phase {
	case statehook.BeforePause:
		bctx, cancel := context.WithTimeout(ctx, s.cfg.Budget)
		defer cancel()
		_, err := s.write(bctx, ev.Sandbox, TriggerPause, ev.Actor, Supplied{}, false)
		return err
	case statehook.BeforeStop:
		if ev.Sandbox.State != sandbox.Running {
			return nil
		}
		bctx, cancel := context.WithTimeout(ctx, s.cfg.Budget)
		defer cancel()
		_, err := s.write(bctx, ev.Sandbox, TriggerStop, ev.Actor, Supplied{}, false)
		return err
	case statehook.Forked:
		return s.inherit(ctx, ev)
	case statehook.Restored:
		return s.restore(ctx, ev)
	}
	return nil
}

// inherit gives a fork child its parent's newest note, marked inherited.
func (s *Service) inherit(ctx context.Context, ev statehook.Event) error {
	if ev.From == "" {
		return nil
	}
	rows, err := s.store.ListNotes(ctx, ev.From, 1)
	if err != nil || len(rows) == 0 {
		return err
	}
	n, err := decode(rows[0])
	if err != nil {
		return err
	}
	ref := &Ref{Sandbox: n.Sandbox, Seq: n.Seq}
	n.Trigger, n.Actor, n.Inherited, n.Restored, n.CreatedAt, n.Millis = TriggerFork, ev.Actor, ref, nil, time.Time{}, 0
	n.Collected = false // a copy: what the parent's machine held then
	var m *Manifest
	if rows[0].Manifest != nil {
		m = &Manifest{}
		if json.Unmarshal(rows[0].Manifest, m) != nil {
			m = nil
		}
	}
	unlock, err := s.lock(ctx, ev.Sandbox.ID)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.append(ctx, ev.Sandbox, n, m)
	return err
}

// restore makes the note of the restored point (the newest note of the
// source at or before PointAt) the sandbox's current one, with a desync
// warning, and the version desync if the agent had declared a newer one.
func (s *Service) restore(ctx context.Context, ev statehook.Event) error {
	src := ev.From
	if src == "" {
		src = ev.Sandbox.ID
	}
	latestRows, err := s.store.ListNotes(ctx, src, 1)
	if err != nil {
		return err
	}
	var latest, point *Note
	if len(latestRows) > 0 {
		l, err := decode(latestRows[0])
		if err != nil {
			return err
		}
		latest = &l
	}
	var m *Manifest
	at := ev.PointAt
	if at.IsZero() {
		at = ev.At
	}
	var n Note
	pr, err := s.store.NoteAt(ctx, src, at)
	switch {
	case err == nil:
		p, err := decode(pr)
		if err != nil {
			return err
		}
		point = &p
		n = p
		n.Restored = &Ref{Sandbox: p.Sandbox, Seq: p.Seq}
		if pr.Manifest != nil {
			m = &Manifest{}
			if json.Unmarshal(pr.Manifest, m) != nil {
				m = nil
			}
		}
	case errs.Is(err, errs.NotFound):
		if latest == nil {
			return nil // no notes at all: nothing to restore or warn about
		}
		n = Note{Collected: false}
		n.Files.Error = "no note at or before the restored point"
	default:
		return err
	}
	what := "checkpoint " + ev.Checkpoint
	if ev.Checkpoint == "" {
		what = "snapshot " + ev.Snapshot
	}
	n.Trigger, n.Actor, n.Inherited, n.CreatedAt, n.Millis, n.Collected = TriggerRestore, ev.Actor, nil, time.Time{}, 0, false
	n.Warnings = append([]string{"desync: the machine was restored to " + what + " (" + at.UTC().Format(time.RFC3339) +
		"); notes written after that point describe a state it no longer has"}, n.Warnings...)
	n.Warnings = n.Warnings[:min(len(n.Warnings), 4)]
	n.Desync = RestoreDesync(point, latest)
	unlock, err := s.lock(ctx, ev.Sandbox.ID)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.append(ctx, ev.Sandbox, n, m)
	return err
}

// Package effects is the side-effect ledger (issue 17, docs/EFFECTS.md):
// it owns the record of every request with side effects a sandbox made
// through the egress proxy — its intent, written before the request is
// sent, then its outcome — each sandbox's place in its lineage (root, fork
// parent and point, the spans of its past that restores undid), and the
// repeat decision: a fork's or a restored sandbox's retry of a completed
// effect is answered from the ledger or refused, never sent again.
//
// It implements egress.Ledger for the proxy and statehook.Hook for the
// lifecycle. Two locks: a lineage's lock serialises the repeat decisions
// of that lineage (the read of its earlier effects and the reservation
// of the new one) and the changes of its scopes, so lineages decide in
// parallel; Service.mu guards the maps and is a leaf, taken under a
// lineage's lock, never the other way round. Both are taken by the
// proxy's goroutines and by hooks (under a sandbox's lock), Service.mu
// also by the committer's completions; neither is held while the core is
// called or a commit is waited for. Intents and outcomes are written by
// the committer (commit.go): one commit for all that arrive together.
package effects

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the ledger needs of the lifecycle core.
type Core interface {
	Store() store.Store
	// Visible loads a sandbox as owner may see it ("" = admin).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
}

// Auditor receives an entry per recorded effect and outcome (docs/STATE.md).
type Auditor interface {
	Audit(ctx context.Context, actor, action, sandboxID string, data map[string]string)
}

// StepSource names a sandbox's current task step ("" = none).
type StepSource interface {
	CurrentStep(ctx context.Context, sandboxID string) string
}

// Config configures the ledger; zero fields take defaults.
type Config struct {
	Log   *slog.Logger
	Now   func() time.Time
	Audit Auditor    // nil: none
	Steps StepSource // nil: no steps
	// MaxPerSandbox bounds the effects one sandbox may record; past it,
	// effectful requests are refused (429), not sent unrecorded.
	MaxPerSandbox int
	// ReplayBudget bounds the bytes of recorded answers one sandbox keeps;
	// past it, effects are recorded without a replay.
	ReplayBudget int64
}

// Defaults of Config.
const (
	DefaultMaxPerSandbox = 10000
	DefaultReplayBudget  = 64 << 20
	// maxWindows bounds the restore windows kept per sandbox (oldest go).
	maxWindows = 64
	// maxChain bounds how many ancestors a listing walks.
	maxChain = 32
	// opTimeout bounds one store operation on the proxy's path.
	opTimeout = 10 * time.Second
)

// Service is the side-effect ledger.
type Service struct {
	core Core
	cfg  Config
	log  *slog.Logger

	mu       sync.Mutex
	scopes   map[string]store.EffectScope // cache of the store's scopes
	counts   map[string]*usage            // per sandbox, loaded on first use
	inflight map[string]*flight           // effects sent by this daemon whose outcome is not stored yet
	lineages map[string]*lineageLock      // decisions under way, per lineage
	w        *committer
}

// lineageLock is one lineage's decision lock; refs counts the goroutines
// holding or waiting for it (it is dropped from the map at zero).
type lineageLock struct {
	mu   sync.Mutex
	refs int
}

// flight is an effect being sent; done is closed once its outcome is
// stored (or its intent could not be).
type flight struct {
	sandbox string
	done    chan struct{}
	// rec is the intent. A repeat decided while it is in flight finds it
	// here, whether or not the decision's read of the store (made before
	// the lineage's other goroutines take s.mu) saw it committed.
	rec *store.Effect
	// out is the outcome while its commit is under way: listings show it.
	out *store.EffectOutcome
}

// maxWaits bounds how often Begin waits for an in-flight effect it repeats.
const maxWaits = 3

type usage struct {
	n      int
	replay int64
	owner  string // the sandbox's owner, recorded on each effect
}

// New builds the ledger.
func New(core Core, cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxPerSandbox <= 0 {
		cfg.MaxPerSandbox = DefaultMaxPerSandbox
	}
	if cfg.ReplayBudget <= 0 {
		cfg.ReplayBudget = DefaultReplayBudget
	}
	return &Service{core: core, cfg: cfg, log: cfg.Log, scopes: map[string]store.EffectScope{},
		counts: map[string]*usage{}, inflight: map[string]*flight{}, lineages: map[string]*lineageLock{},
		w: &committer{st: core.Store, log: cfg.Log, linger: linger}}
}

// Flush waits until every intent and outcome handed to the ledger is
// committed (or ctx ends): the daemon calls it when it stops, tests
// before they read the store directly.
func (s *Service) Flush(ctx context.Context) error { return s.w.flush(ctx) }

// Commits is how many commits the ledger made and how many writes
// (intents and outcomes) they carried: their ratio is group commit's gain.
func (s *Service) Commits() (commits, writes int64) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.commits, s.w.writes
}

// SetSteps installs the task ledger's current step. Call it while wiring,
// before the proxy serves (the field is read without a lock).
func (s *Service) SetSteps(st StepSource) { s.cfg.Steps = st }

// SetAuditor installs the audit log; like SetSteps, while wiring.
func (s *Service) SetAuditor(a Auditor) { s.cfg.Audit = a }

func (s *Service) audit(ctx context.Context, action, sandboxID string, data map[string]string) {
	if s.cfg.Audit != nil {
		s.cfg.Audit.Audit(ctx, "berth", action, sandboxID, data)
	}
}

// scopeLocked is a sandbox's scope; one with none put is its own root.
func (s *Service) scopeLocked(ctx context.Context, id string) (store.EffectScope, error) {
	if sc, ok := s.scopes[id]; ok {
		return sc, nil
	}
	sc, err := s.core.Store().GetEffectScope(ctx, id)
	if errs.Is(err, errs.NotFound) {
		sc, err = store.EffectScope{SandboxID: id, Lineage: id}, nil
	}
	if err != nil {
		return store.EffectScope{}, err
	}
	s.scopes[id] = sc
	return sc, nil
}

func (s *Service) usageLocked(ctx context.Context, id string) (*usage, error) {
	if u := s.counts[id]; u != nil {
		return u, nil
	}
	n, b, err := s.core.Store().CountEffects(ctx, id)
	if err != nil {
		return nil, err
	}
	u := &usage{n: n, replay: b}
	if sb, err := s.core.Store().GetSandbox(ctx, id); err == nil {
		u.owner = sb.Owner
	}
	s.counts[id] = u
	return u, nil
}

func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "ef" + hex.EncodeToString(b[:])
}

// replayJSON is the stored form of a recorded answer.
type replayJSON struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// Begin records an effectful request's intent (egress.Ledger), or answers
// a repeat from the ledger. It is serialised per lineage so two
// concurrent requests with the same key cannot both be sent; a repeat of
// an effect still being sent waits (bounded) for its outcome and is then
// answered from it.
func (s *Service) Begin(ctx context.Context, in egress.Intent) (egress.Ticket, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	step := lookupStep(ctx, s.cfg.Steps, in.SandboxID)
	defer step.get() // joined before Begin returns
	for waits := 0; ; waits++ {
		t, wait, err := s.begin(ctx, in, step, waits < maxWaits)
		if t.Effect != "" && t.Replay == nil && err == nil {
			return s.commitIntent(t)
		}
		if wait == nil {
			return t, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return egress.Ticket{Status: http.StatusConflict,
				Message: "the same effect is still being sent; not sent twice"}, nil
		}
	}
}

// lockLineage takes the decision lock of sandbox id's lineage and returns
// its scope, read under that lock (a scope changes only under it), and
// the unlock.
func (s *Service) lockLineage(ctx context.Context, id string) (store.EffectScope, func(), error) {
	for {
		s.mu.Lock()
		sc, err := s.scopeLocked(ctx, id)
		if err != nil {
			s.mu.Unlock()
			return store.EffectScope{}, nil, err
		}
		l := s.lineages[sc.Lineage]
		if l == nil {
			l = &lineageLock{}
			s.lineages[sc.Lineage] = l
		}
		l.refs++
		s.mu.Unlock()
		l.mu.Lock()
		unlock := func() {
			l.mu.Unlock()
			s.mu.Lock()
			if l.refs--; l.refs == 0 {
				delete(s.lineages, sc.Lineage)
			}
			s.mu.Unlock()
		}
		s.mu.Lock()
		now, err := s.scopeLocked(ctx, id)
		s.mu.Unlock()
		if err == nil && now.Lineage == sc.Lineage {
			return now, unlock, nil
		}
		unlock() // it joined another lineage meanwhile (a fork's scope put): again
		if err != nil {
			return store.EffectScope{}, nil, err
		}
	}
}

// begin is one decision under the lineage's lock; wait is set when the
// request repeats an effect in flight and may wait for it (mayWait).
func (s *Service) begin(ctx context.Context, in egress.Intent, step *stepLookup, mayWait bool) (egress.Ticket, <-chan struct{}, error) {
	sc, unlock, err := s.lockLineage(ctx, in.SandboxID)
	if err != nil {
		return egress.Ticket{}, nil, err
	}
	defer unlock()
	s.mu.Lock()
	u, err := s.usageLocked(ctx, in.SandboxID)
	s.mu.Unlock()
	if err != nil {
		return egress.Ticket{}, nil, err
	}
	// With the agent's key the read is by key alone, so the step (a read
	// of the task ledger) is looked up alongside it; the identity, which
	// needs the step, is computed after.
	id := ""
	if in.Key == "" {
		id = Identity(sc.Lineage, step.get(), in.Method, in.Host, in.Path, in.BodySHA256)
	}
	key, source := in.Key, ""
	switch {
	case key != "":
		source = "agent"
	case in.Policy.Idempotency == egress.IdempotencyDerive:
		key, source = DeriveKey(id), "derived"
	}
	// The read is under the lineage's lock only: other lineages decide
	// meanwhile. A repeat can only be of an effect of this lineage, whose
	// reservations all happen under this lock.
	//
	// A flight can end (its outcome committed, then dropped from memory)
	// between the read and the look at memory below: the read then shows it
	// pending and memory no longer has it, and the decision would take a
	// withdrawn or completed effect for one that may have happened. The
	// flights of the lineage before the read say which: such an effect is
	// read again (a pending one no flight had is a crash's, left as read).
	flying := s.lineageFlights(sc.Lineage)
	found, err := s.core.Store().FindEffects(ctx, sc.Lineage, key, id, 16)
	if err != nil {
		return egress.Ticket{}, nil, err
	}
	if id == "" {
		id = Identity(sc.Lineage, step.get(), in.Method, in.Host, in.Path, in.BodySHA256)
	}
	s.mu.Lock()
	for range 4 {
		landed := false
		for _, e := range found {
			if e.State == store.EffectPending && flying[e.ID] && s.inflight[e.ID] == nil {
				landed = true
			}
		}
		if !landed {
			break
		}
		flying = s.lineageFlightsLocked(sc.Lineage)
		s.mu.Unlock()
		found, err = s.core.Store().FindEffects(ctx, sc.Lineage, key, id, 16)
		s.mu.Lock()
		if err != nil {
			s.mu.Unlock()
			return egress.Ticket{}, nil, err
		}
	}
	locked := true
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	priors := make([]Prior, 0, len(found))
	// Effects in flight are the newest, and the read may predate their
	// commit: taken from memory (their outcome is not stored yet, or its
	// commit's completion has not run: a repeat waits for it).
	for eid, f := range s.inflight {
		if r := f.rec; r.Lineage == sc.Lineage && (key != "" && r.Key == key || key == "" && r.Identity == id) {
			priors = append(priors, Prior{ID: eid, SandboxID: r.SandboxID, Host: r.Host, State: store.EffectPending, InFlight: true, StartedAt: r.StartedAt})
		}
	}
	for _, e := range found {
		if s.inflight[e.ID] != nil {
			continue // listed above
		}
		priors = append(priors, Prior{ID: e.ID, SandboxID: e.SandboxID, Host: e.Host, State: e.State,
			Status: e.Status, Replayable: e.State == store.EffectCompleted && e.Reason == "", StartedAt: e.StartedAt})
	}
	// Replayable is settled against the stored answer below; a completed
	// effect without one carries a reason.
	dec := Decide(Request{SandboxID: in.SandboxID, Host: in.Host, Keyed: key != "", Windows: sc.Windows, Repeat: in.Policy.Repeat}, priors)
	if f := s.flightOf(dec); f != nil && mayWait {
		return egress.Ticket{}, f.done, nil
	}
	data := map[string]string{"method": in.Method, "host": in.Host, "path": in.Path, "body_sha256": in.BodySHA256}
	if dec.Action != Send {
		// The answer is read from the store under the lineage's lock only.
		s.mu.Unlock()
		locked = false
	}
	switch dec.Action {
	case Replay:
		e, err := s.core.Store().GetEffect(ctx, dec.Prior.ID)
		var r replayJSON
		if err == nil && e.Replay != nil && json.Unmarshal(e.Replay, &r) == nil {
			data["effect"] = e.ID
			s.audit(ctx, "effect.replayed", in.SandboxID, data)
			s.log.Info("effect replayed from the ledger", "sandbox_id", in.SandboxID, "effect", e.ID, "host", in.Host)
			return egress.Ticket{Effect: e.ID, Replay: &egress.Replay{Status: r.Status, Header: r.Header, Body: r.Body}}, nil, nil
		}
		dec = Decision{Action: Refuse, Prior: dec.Prior, Status: http.StatusConflict,
			Message: "this effect already happened (" + dec.Prior.ID + ") but its answer cannot be replayed; not sent again"}
		fallthrough
	case Refuse:
		data["effect"], data["reason"] = dec.Prior.ID, dec.Message
		s.audit(ctx, "effect.refused", in.SandboxID, data)
		return egress.Ticket{Status: dec.Status, Message: dec.Message}, nil, nil
	}
	if u.n >= s.cfg.MaxPerSandbox {
		msg := "this sandbox recorded " + strconv.Itoa(u.n) + " side effects, the most the ledger keeps for one sandbox; not sent"
		s.audit(ctx, "effect.refused", in.SandboxID, map[string]string{"host": in.Host, "reason": msg})
		return egress.Ticket{Status: http.StatusTooManyRequests, Message: msg}, nil, nil
	}
	// Reserved here, under s.mu, so a repeat decided from now on sees it
	// in flight; written by the committer (Begin waits for that).
	e := &store.Effect{ID: newID(), Lineage: sc.Lineage, SandboxID: in.SandboxID, Owner: u.owner,
		Step: step.get(), Method: in.Method, Host: in.Host, Path: in.Path, BodySHA256: in.BodySHA256, BodySize: in.BodySize,
		Key: key, KeySource: source, Identity: id, Secret: in.Secret, StartedAt: s.cfg.Now().UTC()}
	u.n++
	s.inflight[e.ID] = &flight{sandbox: in.SandboxID, done: make(chan struct{}), rec: e}
	t := egress.Ticket{Effect: e.ID}
	if source == "derived" {
		t.SetKey = key
	}
	return t, nil, nil
}

// lineageFlights are the ids of lineage's effects in flight now.
func (s *Service) lineageFlights(lineage string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lineageFlightsLocked(lineage)
}

func (s *Service) lineageFlightsLocked(lineage string) map[string]bool {
	out := map[string]bool{}
	for id, f := range s.inflight {
		if f.rec.Lineage == lineage {
			out[id] = true
		}
	}
	return out
}

// stepLookup is the sandbox's current step, read from the StepSource on
// a goroutine of its own while the decision reads the store; get waits
// for it (Begin's goroutine only).
type stepLookup struct {
	ch   chan string
	val  string
	done bool
}

func lookupStep(ctx context.Context, src StepSource, sandboxID string) *stepLookup {
	l := &stepLookup{ch: make(chan string, 1)}
	if src == nil {
		l.done = true
		return l
	}
	go func() { l.ch <- src.CurrentStep(ctx, sandboxID) }()
	return l
}

func (l *stepLookup) get() string {
	if !l.done {
		l.val, l.done = <-l.ch, true
	}
	return l.val
}

// commitIntent waits until the intent reserved for t is durable (it
// shares a commit with the writes queued alongside it) and returns t; if
// it cannot be written the reservation is undone and the request is not
// sent. The wait is bounded by the committer's own timeout, not by the
// request: an intent that may yet be committed is never reported as not
// recorded.
func (s *Service) commitIntent(t egress.Ticket) (egress.Ticket, error) {
	s.mu.Lock()
	f := s.inflight[t.Effect]
	e := f.rec
	s.mu.Unlock()
	res := make(chan error, 1)
	s.w.submit(job{w: store.EffectWrite{Record: e}, done: func(err error) { res <- err }})
	err := <-res
	s.mu.Lock()
	if err != nil {
		delete(s.inflight, t.Effect)
		if u := s.counts[e.SandboxID]; u != nil {
			u.n--
		}
	}
	s.mu.Unlock()
	if err != nil {
		close(f.done) // a repeat waiting for it decides again
		return egress.Ticket{}, err
	}
	s.audit(context.Background(), "effect.intent", e.SandboxID, map[string]string{"method": e.Method, "host": e.Host, "path": e.Path,
		"body_sha256": e.BodySHA256, "effect": e.ID, "key_source": e.KeySource, "step": e.Step})
	return t, nil
}

// flightOf is the in-flight effect a refusal is about, if any.
func (s *Service) flightOf(dec Decision) *flight {
	if dec.Action != Refuse || dec.Prior == nil || !dec.Prior.InFlight {
		return nil
	}
	return s.inflight[dec.Prior.ID]
}

// Finish records a sent effect's outcome (egress.Ledger). It does not
// wait for the commit: the effect stays in flight — a repeat waits for
// it, listings show the outcome — until the outcome is stored. A crash
// before that leaves the effect unknown.
func (s *Service) Finish(ctx context.Context, id string, out egress.Outcome) {
	o := store.EffectOutcome{State: store.EffectCompleted, Status: out.Status, RespSize: out.Size, EndedAt: s.cfg.Now().UTC()}
	s.mu.Lock()
	f := s.inflight[id]
	sbID := ""
	if f != nil {
		sbID = f.sandbox
	}
	switch {
	case out.NotSent:
		o.State, o.Reason = store.EffectWithdrawn, "not sent"
		if out.Err != nil {
			o.Reason = "not sent: " + out.Err.Error()
		}
	case out.Err != nil:
		o.State, o.Reason = store.EffectUnknown, "sending failed mid-way: "+out.Err.Error()
	case !out.Complete:
		o.Reason = "answer too large to replay"
	default:
		b, err := json.Marshal(replayJSON{Status: out.Status, Header: out.Header, Body: out.Body})
		u := s.counts[sbID]
		switch {
		case err != nil:
			o.Reason = "answer not kept: " + err.Error()
		case u != nil && u.replay+int64(len(b)) > s.cfg.ReplayBudget:
			o.Reason = "the sandbox's replay budget is spent"
		default:
			o.Replay = b
			if u != nil {
				u.replay += int64(len(b))
			}
		}
	}
	if f != nil {
		f.out = &o
	}
	s.mu.Unlock()
	s.w.submit(job{w: store.EffectWrite{ID: id, Finish: &o}, lazy: true, done: func(err error) {
		if err != nil {
			s.log.Error("record effect outcome", "sandbox_id", sbID, "effect", id, "err", err)
		}
		// Only now is it no longer in flight: a repeat waiting for it
		// decides against the stored outcome.
		s.mu.Lock()
		delete(s.inflight, id)
		s.mu.Unlock()
		if f != nil {
			close(f.done)
		}
		data := map[string]string{"effect": id, "state": o.State, "status": strconv.Itoa(o.Status), "response_size": strconv.FormatInt(o.RespSize, 10)}
		if o.Reason != "" {
			data["reason"] = o.Reason
		}
		s.audit(context.WithoutCancel(ctx), "effect.outcome", sbID, data)
	}})
}

// View is an effect as a sandbox sees it: its own, or inherited (made by
// an ancestor before the fork point, read-only).
type View struct {
	store.Effect
	Inherited  bool
	Replayable bool
}

// List returns the effects a sandbox sees (its own and inherited ones),
// oldest first, started after since (zero = all).
func (s *Service) List(ctx context.Context, owner, id string, since time.Time) ([]View, error) {
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return nil, err
	}
	return s.Since(ctx, id, since)
}

// Since returns the effects sandboxID sees that started after t: after a
// rewind to a point at t, those are the outside effects the restored state
// does not know of (they are listed, never forgotten).
func (s *Service) Since(ctx context.Context, sandboxID string, t time.Time) ([]View, error) {
	var out []View
	id, until := sandboxID, time.Time{}
	seen := map[string]bool{}
	for depth := 0; id != "" && depth < maxChain && !seen[id]; depth++ {
		seen[id] = true
		list, err := s.core.Store().ListEffects(ctx, store.EffectFilter{SandboxID: id, Since: t, Until: until})
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		var gone []int // pending in the read, no longer in flight: read again
		for _, e := range list {
			f, live := s.inflight[e.ID]
			switch {
			case e.State != store.EffectPending:
			case !live:
				gone = append(gone, len(out))
			case f.out != nil: // the outcome's commit is under way
				e.State, e.Status, e.RespSize, e.Reason, e.EndedAt = f.out.State, f.out.Status, f.out.RespSize, f.out.Reason, f.out.EndedAt
			}
			out = append(out, View{Effect: e, Inherited: depth > 0, Replayable: e.State == store.EffectCompleted && e.Reason == ""})
		}
		sc, err := s.scopeLocked(ctx, id)
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		// A flight leaves only once its outcome is stored, so the outcome
		// may have landed between the listing's read and the look at
		// memory: read it again before calling it unknown.
		for _, i := range gone {
			v := &out[i]
			if e, err := s.core.Store().GetEffect(ctx, v.ID); err == nil && e.State != store.EffectPending {
				e.Replay = nil
				v.Effect, v.Replayable = e, e.State == store.EffectCompleted && e.Reason == ""
			} else {
				v.State = store.EffectUnknown // its daemon stopped before the outcome
			}
		}
		if sc.Parent == "" {
			break
		}
		if until.IsZero() || sc.PointAt.Before(until) {
			until = sc.PointAt
		}
		id = sc.Parent
	}
	// Oldest first across the chain.
	sortViews(out)
	return out, nil
}

func sortViews(v []View) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j].StartedAt.Before(v[j-1].StartedAt); j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}

// OnState applies the ledger's row of the state table (statehook.Hook):
// a fork or a sandbox created from a snapshot joins its source's lineage
// and inherits its effects up to the point; a rewind records the span of
// the past it undid. Pause and resume keep everything.
func (s *Service) OnState(ctx context.Context, ev statehook.Event) error {
	if ev.Sandbox == nil {
		return nil
	}
	id := ev.Sandbox.ID
	switch {
	case ev.Phase == statehook.Forked, ev.Phase == statehook.Restored && ev.From != "" && ev.From != id:
		from, unlock, err := s.lockLineage(ctx, ev.From) // the lineage id joins
		if err != nil {
			return err
		}
		defer unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		sc := store.EffectScope{SandboxID: id, Lineage: from.Lineage, Parent: ev.From, PointAt: ev.PointAt}
		if err := s.core.Store().PutEffectScope(ctx, sc); err != nil {
			return err
		}
		s.scopes[id] = sc
	case ev.Phase == statehook.Restored && ev.From == id:
		// Under the lineage's lock: a decision sees the undone span or
		// comes before it, never half of it.
		sc, unlock, err := s.lockLineage(ctx, id)
		if err != nil {
			return err
		}
		defer unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		at := ev.At
		if at.IsZero() {
			at = s.cfg.Now()
		}
		sc.Windows = append(append([]store.RestoreWindow(nil), sc.Windows...), store.RestoreWindow{PointAt: ev.PointAt.UTC(), At: at.UTC()})
		if len(sc.Windows) > maxWindows {
			sc.Windows = sc.Windows[len(sc.Windows)-maxWindows:]
		}
		if err := s.core.Store().PutEffectScope(ctx, sc); err != nil {
			return err
		}
		s.scopes[id] = sc
	}
	return nil
}

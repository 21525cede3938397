package kubestore

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/store"
)

const (
	tableEffect      = "effect"   // key effect id
	tableEffectScope = "effscope" // key sandbox
	counterEffect    = "effect"
)

// effectRow is an effect as stored (its replay inline: one read gets it
// all; lists drop it before returning).
type effectRow struct {
	ID         string    `json:"id"`
	Seq        int64     `json:"seq"`
	Lineage    string    `json:"lineage"`
	SandboxID  string    `json:"sandbox"`
	Owner      string    `json:"owner,omitempty"`
	Step       string    `json:"step,omitempty"`
	Method     string    `json:"method,omitempty"`
	Host       string    `json:"host,omitempty"`
	Path       string    `json:"path,omitempty"`
	BodySHA256 string    `json:"bodySHA256,omitempty"`
	BodySize   int64     `json:"bodySize,omitempty"`
	Key        string    `json:"key,omitempty"`
	KeySource  string    `json:"keySource,omitempty"`
	Identity   string    `json:"identity,omitempty"`
	Secret     bool      `json:"secret,omitempty"`
	State      string    `json:"state"`
	Status     int       `json:"status,omitempty"`
	RespSize   int64     `json:"respSize,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	EndedAt    time.Time `json:"endedAt"`
	Replay     []byte    `json:"replay,omitempty"`
}

func effectRowOf(e store.Effect) effectRow { return effectRow(e) }

func (r effectRow) effect() store.Effect { return store.Effect(r) }

func effectLabels(e effectRow) map[string]string {
	l := map[string]string{labelSandbox: e.SandboxID, labelLineage: e.Lineage, labelIdentity: e.Identity}
	if e.Key != "" {
		l[labelIdemKey] = e.Key
	}
	return l
}

// checkEffect validates an intent and fills its defaults (as SQLite does).
func checkEffect(e *store.Effect) error {
	switch {
	case e.ID == "":
		return errs.Field("id", "must not be empty")
	case e.SandboxID == "" || e.Lineage == "":
		return errs.Field("sandbox", "an effect needs its sandbox and lineage")
	}
	if e.StartedAt.IsZero() {
		e.StartedAt = time.Now().UTC()
	}
	e.State = store.EffectPending
	return nil
}

func checkOutcome(o store.EffectOutcome) error {
	if o.State != store.EffectCompleted && o.State != store.EffectUnknown && o.State != store.EffectWithdrawn {
		return errs.Field("state", "must be %s, %s or %s, got %q", store.EffectCompleted, store.EffectUnknown, store.EffectWithdrawn, o.State)
	}
	return nil
}

func (s *Store) insertEffect(ctx context.Context, e store.Effect) (*berthv1.Record, error) {
	r := effectRowOf(e)
	rec, err := s.create(ctx, tableEffect, e.ID, e.Seq, effectLabels(r), r)
	if errs.Is(err, errs.AlreadyExists) {
		return nil, errs.E(errs.AlreadyExists, "effect %s already exists", e.ID)
	}
	return rec, err
}

// RecordEffect inserts an intent (State pending) and returns it with Seq.
func (s *Store) RecordEffect(ctx context.Context, e store.Effect) (store.Effect, error) {
	if err := checkEffect(&e); err != nil {
		return store.Effect{}, err
	}
	seq, err := s.nextSeq(ctx, counterEffect, 1)
	if err != nil {
		return store.Effect{}, err
	}
	e.Seq = seq
	if _, err := s.insertEffect(ctx, e); err != nil {
		return store.Effect{}, err
	}
	return e, nil
}

// finishEffect writes the outcome of the pending effect id (conditional on
// the version read: an outcome is written once) and returns the row before
// and after, for an undo.
func (s *Store) finishEffect(ctx context.Context, id string, o store.EffectOutcome) (before row, after *berthv1.Record, err error) {
	for {
		var e effectRow
		r, err := s.get(ctx, tableEffect, id, &e)
		if errs.Is(err, errs.NotFound) || (err == nil && e.State != store.EffectPending) {
			return row{}, nil, errs.E(errs.NotFound, "no pending effect %s", id)
		}
		if err != nil {
			return row{}, nil, err
		}
		e.State, e.Status, e.RespSize, e.Reason, e.EndedAt, e.Replay = o.State, o.Status, o.RespSize, o.Reason, o.EndedAt, o.Replay
		out, err := s.put(ctx, r, effectLabels(e), e)
		if errs.Is(err, errs.Conflict) {
			continue
		}
		return r, out, err
	}
}

// FinishEffect sets the outcome of a pending effect.
func (s *Store) FinishEffect(ctx context.Context, id string, o store.EffectOutcome) error {
	if err := checkOutcome(o); err != nil {
		return err
	}
	_, _, err := s.finishEffect(ctx, id, o)
	return err
}

// WriteEffects applies a batch: the intents' numbers are reserved at once,
// then the writes of distinct effects go in parallel (those of one effect
// in order: an intent before its outcome). A write's own failure is its
// entry in the result; any other failure undoes what the batch wrote
// (intents deleted, outcomes put back to pending) and is err, so "none
// applied" holds unless the undo itself is cut short, which leaves pending
// intents: what the ledger's recovery reads as "outcome unknown".
func (s *Store) WriteEffects(ctx context.Context, ws []store.EffectWrite) ([]error, error) {
	out := make([]error, len(ws))
	intents := 0
	for i := range ws {
		w := &ws[i]
		switch {
		case w.Record != nil && w.Finish != nil:
			out[i] = errs.Field("write", "an intent or an outcome, not both")
		case w.Record != nil:
			if out[i] = checkEffect(w.Record); out[i] == nil {
				intents++
			}
		case w.Finish != nil:
			out[i] = checkOutcome(*w.Finish)
		default:
			out[i] = errs.Field("write", "neither an intent nor an outcome")
		}
	}
	if intents > 0 {
		base, err := s.nextSeq(ctx, counterEffect, int64(intents))
		if err != nil {
			return nil, err
		}
		for i := range ws {
			if ws[i].Record != nil && out[i] == nil {
				ws[i].Record.Seq = base
				base++
			}
		}
	}
	// Group the valid writes by effect id, keeping their order.
	var groups [][]int
	byID := map[string]int{}
	for i := range ws {
		if out[i] != nil {
			continue
		}
		id := ws[i].ID
		if ws[i].Record != nil {
			id = ws[i].Record.ID
		}
		g, ok := byID[id]
		if !ok {
			g = len(groups)
			byID[id] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	var (
		u     undo
		mu    sync.Mutex
		fatal error
	)
	err := each(len(groups), func(g int) error {
		for _, i := range groups[g] {
			w := ws[i]
			var err error
			if w.Record != nil {
				var rec *berthv1.Record
				if rec, err = s.insertEffect(ctx, *w.Record); err == nil {
					u.push(func(ctx context.Context) { s.deleteRow(ctx, rec) })
				}
			} else {
				var before row
				var after *berthv1.Record
				if before, after, err = s.finishEffect(ctx, w.ID, *w.Finish); err == nil {
					u.push(func(ctx context.Context) {
						var e effectRow
						if before.decode(&e) == nil {
							before.ResourceVersion = after.ResourceVersion
							_, _ = s.put(ctx, before, effectLabels(e), e)
						}
					})
				}
			}
			if err != nil && !errs.Is(err, errs.AlreadyExists) && !errs.Is(err, errs.NotFound) && !errs.Is(err, errs.InvalidArgument) {
				mu.Lock()
				fatal = err
				mu.Unlock()
				return err
			}
			out[i] = err
		}
		return nil
	})
	if err != nil || fatal != nil {
		u.run(ctx)
		if err == nil {
			err = fatal
		}
		return nil, err
	}
	return out, nil
}

// GetEffect returns one effect with its replay.
func (s *Store) GetEffect(ctx context.Context, id string) (store.Effect, error) {
	var e effectRow
	if _, err := s.get(ctx, tableEffect, id, &e); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Effect{}, errs.E(errs.NotFound, "effect %s not found", id)
		}
		return store.Effect{}, err
	}
	return e.effect(), nil
}

func (s *Store) effects(ctx context.Context, match map[string]string, keep func(effectRow) bool) ([]effectRow, error) {
	rs, err := s.list(ctx, tableEffect, match)
	if err != nil {
		return nil, err
	}
	es, _, err := decodeRows[effectRow](rs, tableEffect)
	if err != nil {
		return nil, err
	}
	out := es[:0]
	for _, e := range es {
		if keep(e) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// FindEffects returns the newest effects of lineage with key (when not
// "") or else identity, at most limit, without their Replay.
func (s *Store) FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]store.Effect, error) {
	if limit <= 0 {
		limit = 16
	}
	match := map[string]string{labelLineage: lineage}
	keep := func(e effectRow) bool { return e.Lineage == lineage && e.Identity == identity }
	if key != "" {
		match[labelIdemKey] = key
		keep = func(e effectRow) bool { return e.Lineage == lineage && e.Key == key }
	} else {
		match[labelIdentity] = identity
	}
	es, err := s.effects(ctx, match, keep)
	if err != nil {
		return nil, err
	}
	var out []store.Effect
	for i := len(es) - 1; i >= 0 && len(out) < limit; i-- {
		e := es[i].effect()
		e.Replay = nil
		out = append(out, e)
	}
	return out, nil
}

// ListEffects lists a sandbox's own effects by Seq, without Replay.
func (s *Store) ListEffects(ctx context.Context, f store.EffectFilter) ([]store.Effect, error) {
	es, err := s.effects(ctx, map[string]string{labelSandbox: f.SandboxID}, func(e effectRow) bool {
		return e.SandboxID == f.SandboxID && (f.Since.IsZero() || e.StartedAt.After(f.Since)) &&
			(f.Until.IsZero() || !e.StartedAt.After(f.Until))
	})
	if err != nil {
		return nil, err
	}
	var out []store.Effect
	for _, r := range es {
		e := r.effect()
		e.Replay = nil
		out = append(out, e)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// CountEffects counts a sandbox's own effects and the bytes of their replays.
func (s *Store) CountEffects(ctx context.Context, sandboxID string) (int, int64, error) {
	es, err := s.effects(ctx, map[string]string{labelSandbox: sandboxID}, func(e effectRow) bool { return e.SandboxID == sandboxID })
	if err != nil {
		return 0, 0, err
	}
	var b int64
	for _, e := range es {
		b += int64(len(e.Replay))
	}
	return len(es), b, nil
}

type scopeRow struct {
	SandboxID string                `json:"sandbox"`
	Lineage   string                `json:"lineage"`
	Parent    string                `json:"parent,omitempty"`
	PointAt   time.Time             `json:"pointAt"`
	Windows   []store.RestoreWindow `json:"windows,omitempty"`
}

// PutEffectScope replaces a sandbox's scope.
func (s *Store) PutEffectScope(ctx context.Context, sc store.EffectScope) error {
	if sc.SandboxID == "" || sc.Lineage == "" {
		return errs.Field("sandbox", "a scope needs its sandbox and lineage")
	}
	return s.upsert(ctx, tableEffectScope, sc.SandboxID, 0, nil, scopeRow(sc))
}

// GetEffectScope returns a sandbox's scope (NotFound when none was put).
func (s *Store) GetEffectScope(ctx context.Context, sandboxID string) (store.EffectScope, error) {
	var sc scopeRow
	if _, err := s.get(ctx, tableEffectScope, sandboxID, &sc); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.EffectScope{}, errs.E(errs.NotFound, "no effect scope for %s", sandboxID)
		}
		return store.EffectScope{}, err
	}
	return store.EffectScope(sc), nil
}

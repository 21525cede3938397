package tasks

import (
	"context"
	"encoding/json"
	"reflect"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// OnState is the ledger's row of the state table (docs/STATE.md): pause and
// resume keep the ledger as it is (it is outside the sandbox; resume and GET
// show its summary), a fork's child gets a copy of its parent's ledger at
// the fork point, each task marked as forked at its step N, and a restore
// rolls the ledger back to the restored point, leaving a warning that
// lists the steps and gates it undid. It runs under the sandbox's lock.
func (s *Service) OnState(ctx context.Context, ev statehook.Event) error {
	if ev.Sandbox == nil || ev.From == "" {
		return nil
	}
	switch ev.Phase {
	case statehook.Forked:
		return s.fork(ctx, ev.Sandbox.ID, ev.From, ev.PointAt, ev.Actor)
	case statehook.Restored:
		return s.restore(ctx, ev)
	}
	return nil
}

// fork copies parent's ledger at point into the (new) child.
func (s *Service) fork(ctx context.Context, child, parent string, point time.Time, actor string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changes, err := s.changes(ctx, parent, "", point)
	if err != nil {
		return err
	}
	then := At(changes, point)
	if len(then) == 0 {
		return nil
	}
	w := store.TaskWrite{Sandbox: child}
	if err := s.resets(&w, ForkCopy(then, parent, point), nil, actor); err != nil {
		return err
	}
	return s.core.Store().WriteTasks(ctx, w)
}

// restore rolls ev.Sandbox's ledger back to the ledger ev.From had at
// ev.PointAt: a rewind in place (the same sandbox), or a new sandbox
// created from a snapshot of From (whose ledger starts as that).
func (s *Service) restore(ctx context.Context, ev statehook.Event) error {
	if ev.PointAt.IsZero() {
		return errs.E(errs.InvalidArgument, "restore of %s: no point in time to roll the task ledger back to", ev.Sandbox.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	target, from := ev.Sandbox.ID, ev.From
	changes, err := s.changes(ctx, from, "", ev.PointAt)
	if err != nil {
		return err
	}
	then := At(changes, ev.PointAt)
	source, _, err := s.load(ctx, from)
	if err != nil {
		return err
	}
	current := source
	if target != from {
		if current, _, err = s.load(ctx, target); err != nil {
			return err
		}
	}
	changed := Diff(source, then)
	if len(then) == 0 && len(changed) == 0 && len(current) == 0 {
		return nil
	}
	rb := &Rollback{At: s.core.Now().UTC(), PointAt: ev.PointAt, From: from, Checkpoint: ev.Checkpoint, Snapshot: ev.Snapshot, Changed: changed}
	w := store.TaskWrite{Sandbox: target}
	if err := s.resets(&w, then, current, ev.Actor); err != nil {
		return err
	}
	b, err := json.Marshal(record{Rollback: rb})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode task ledger record")
	}
	w.Ledger = b
	if err := s.core.Store().WriteTasks(ctx, w); err != nil {
		return err
	}
	if a := s.cfg.Auditor; a != nil {
		a.Audit(ctx, ev.Actor, "task.rollback", target, map[string]string{
			"from": from, "checkpoint": ev.Checkpoint, "snapshot": ev.Snapshot,
			"point_at": ev.PointAt.Format(time.RFC3339Nano), "steps": joinSteps(rb.Steps())})
	}
	return nil
}

func joinSteps(l []string) string {
	out := ""
	for i, s := range l {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}

// resets fills w so that the ledger holding current becomes want: a reset
// change and a put for each task that differs, a reset to nothing and a
// delete for each task want lacks.
func (s *Service) resets(w *store.TaskWrite, want, current []*Task, actor string) error {
	now := s.core.Now().UTC()
	have := map[string]*Task{}
	for _, t := range current {
		have[t.ID] = t
	}
	keep := map[string]bool{}
	for _, t := range want {
		keep[t.ID] = true
		if reflect.DeepEqual(have[t.ID], t) {
			continue
		}
		put, err := taskRecord(t)
		if err != nil {
			return err
		}
		ch, err := changeRecord(w.Sandbox, Change{Task: t.ID, At: now, Actor: actor, Op: OpReset, State: t})
		if err != nil {
			return err
		}
		w.Put, w.Changes = append(w.Put, put), append(w.Changes, ch)
	}
	for _, t := range current {
		if keep[t.ID] {
			continue
		}
		ch, err := changeRecord(w.Sandbox, Change{Task: t.ID, At: now, Actor: actor, Op: OpReset})
		if err != nil {
			return err
		}
		w.Delete, w.Changes = append(w.Delete, t.ID), append(w.Changes, ch)
	}
	return nil
}

package kubestore

import (
	"cmp"
	"context"
	"slices"
	"strconv"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Events are records of table "events", keyed by their seq, labelled with
// their sandbox and owner. They carry no LabelCascade: a sandbox's events
// outlive it.
const tableEvents = "events"

// AppendEvent reserves the next seq of the one events counter and creates
// the event's record.
func (s *Store) AppendEvent(ctx context.Context, ev sandbox.Event) (int64, error) {
	return s.appendEvent(ctx, ev, nil)
}

// appendEvent stores ev; sb is the sandbox as a transition left it (nil
// for a bare AppendEvent).
func (s *Store) appendEvent(ctx context.Context, ev sandbox.Event, sb *sandbox.Sandbox) (int64, error) {
	if ev.Type == "" {
		return 0, errs.Field("type", "must not be empty")
	}
	if ev.Time.IsZero() {
		ev.Time = s.now().UTC()
	}
	seq, err := s.nextSeq(ctx, tableEvents, 1)
	if err != nil {
		return 0, err
	}
	ev.Seq = seq
	labels := map[string]string{"sandbox": ev.SandboxID, "owner": ev.Owner}
	if err := s.insert(ctx, tableEvents, strconv.FormatInt(seq, 10), seq, labels, ev); err != nil {
		return 0, err
	}
	return seq, s.eventStored(ctx, ev, sb)
}

// eventStored runs after an event's record is written: what SQLite's
// triggers on events do (the activity timeline's entry).
func (s *Store) eventStored(ctx context.Context, ev sandbox.Event, sb *sandbox.Sandbox) error {
	return s.eventActivityB(ctx, ev, sb)
}

// ListEvents selects by sandbox and owner labels, then filters, orders
// and cuts here.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]sandbox.Event, error) {
	if f.Limit < 0 {
		return nil, errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	match := map[string]string{}
	if f.SandboxID != "" {
		match["sandbox"] = f.SandboxID
	}
	if f.Owner != "" {
		match["owner"] = f.Owner
	}
	rows, err := s.list(ctx, tableEvents, match)
	if err != nil {
		return nil, err
	}
	out := []sandbox.Event{}
	for _, r := range rows {
		if r.Spec.Seq <= f.AfterSeq {
			continue
		}
		var ev sandbox.Event
		if err := r.decode(&ev); err != nil {
			return nil, err
		}
		if (f.SandboxID != "" && ev.SandboxID != f.SandboxID) || (f.Owner != "" && ev.Owner != f.Owner) {
			continue
		}
		ev.Seq = r.Spec.Seq
		out = append(out, ev)
	}
	slices.SortFunc(out, func(a, b sandbox.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

package activity

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Limits of a Query.
const (
	DefaultLimit = 1000
	MaxLimit     = 10000
	// recheck is how often a follower checks that its sandbox still
	// exists (and catches entries a wake-up missed).
	recheck = time.Second
)

// Query selects entries of one sandbox.
type Query struct {
	After int64
	Limit int      // 0 = DefaultLimit
	Kinds []string // empty = every kind
}

// Validate names the bad field.
func (q *Query) Validate() error {
	switch {
	case q.After < 0:
		return errs.Field("after", "must not be negative, got %d", q.After)
	case q.Limit < 0 || q.Limit > MaxLimit:
		return errs.Field("limit", "must be between 1 and %d, got %d", MaxLimit, q.Limit)
	}
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	for _, k := range q.Kinds {
		if !slices.Contains(Kinds, k) {
			return errs.Field("kind", "unknown kind %q; allowed: %v", k, Kinds)
		}
	}
	return nil
}

// List answers one page of a sandbox's timeline; another owner's sandbox
// is NotFound.
func (s *Service) List(ctx context.Context, owner, id string, q Query) (wire.ActivityList, error) {
	if err := q.Validate(); err != nil {
		return wire.ActivityList{}, err
	}
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return wire.ActivityList{}, err
	}
	return s.page(ctx, id, q)
}

func (s *Service) page(ctx context.Context, id string, q Query) (wire.ActivityList, error) {
	rows, err := s.store.ListActivity(ctx, store.ActivityFilter{SandboxID: id, AfterSeq: q.After, Kinds: q.Kinds, Limit: q.Limit})
	if err != nil {
		return wire.ActivityList{}, err
	}
	out := wire.ActivityList{Entries: make([]wire.ActivityEntry, 0, len(rows)), Next: q.After}
	for _, r := range rows {
		out.Entries = append(out.Entries, toWire(r))
		out.Next = r.Seq
	}
	return out, nil
}

// Follow sends the entries after q.After, then new ones as they are
// written, until ctx ends (nil), the sandbox is gone (nil) or emit fails.
// The first check of the owner returns its error before anything is sent;
// caughtUp (may be nil) is called once the backlog has been sent.
func (s *Service) Follow(ctx context.Context, owner, id string, q Query, emit func(wire.ActivityEntry) error, caughtUp func()) error {
	if err := q.Validate(); err != nil {
		return err
	}
	if _, err := s.core.Visible(ctx, owner, id); err != nil {
		return err
	}
	t := time.NewTicker(recheck)
	defer t.Stop()
	for {
		ch := s.changed(id)
		for {
			page, err := s.page(ctx, id, q)
			if err != nil {
				s.forget(id, ch)
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			for _, e := range page.Entries {
				if err := emit(e); err != nil {
					s.forget(id, ch)
					return err
				}
			}
			q.After = page.Next
			if len(page.Entries) < q.Limit {
				break
			}
		}
		if caughtUp != nil {
			caughtUp()
			caughtUp = nil
		}
		select {
		case <-ctx.Done():
			s.forget(id, ch)
			return nil
		case <-ch:
		case <-t.C:
			s.forget(id, ch)
			if _, err := s.core.Visible(ctx, owner, id); err != nil {
				if errs.Is(err, errs.NotFound) || ctx.Err() != nil {
					return nil // deleted: the stream ends
				}
				return err
			}
		}
	}
}

package kubestore

import (
	"cmp"
	"context"
	"slices"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// A merge is a record, each of its conflicts another (a conflict carries
// file versions and merged text: one record holding them all could pass
// etcd's object size limit). "One open merge per target" is a claim record
// of the target naming the open merge. All of it goes with the target.
const (
	tableMerges    = "merges"
	tableConflicts = "mergeconflicts"
	tableMergeOpen = "mergeopen"
)

// CreateMerge claims the target when the merge is open, inserts the merge,
// then its conflicts in plan order.
func (s *Store) CreateMerge(ctx context.Context, m store.Merge, cs []store.MergeConflict) error {
	if !rowIDRe.MatchString(m.ID) {
		return errs.Field("id", "merge id must be 1-64 chars of [a-z0-9], got %q", m.ID)
	}
	if m.Target == "" || m.Owner == "" {
		return errs.Field("target", "a merge needs a target and an owner")
	}
	now := s.now().UTC()
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = m.CreatedAt
	}
	owned := ownedBy(m.Target, nil)
	if m.Open() {
		// The holder is gone when its merge is no longer open (an update
		// that closed it and then failed to release the claim) or missing.
		err := s.claim(ctx, tableMergeOpen, m.Target, m.ID, owned, func(other string) (bool, error) {
			o, err := s.GetMerge(ctx, other)
			if errs.Is(err, errs.NotFound) {
				return true, nil
			}
			return err == nil && !o.Open(), err
		})
		if errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "sandbox %s already has an open merge", m.Target)
		}
		if err != nil {
			return err
		}
	}
	labels := ownedBy(m.Target, map[string]string{"target": m.Target})
	if err := s.insert(ctx, tableMerges, m.ID, 0, labels, m); err != nil {
		if m.Open() {
			if rerr := s.release(ctx, tableMergeOpen, m.Target, m.ID); rerr != nil {
				return errs.Wrap(errs.KindOf(err), err, "create merge %s (and release its target: %v)", m.ID, rerr)
			}
		}
		if errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "merge %s already exists", m.ID)
		}
		return err
	}
	for i, c := range cs {
		c.MergeID, c.Seq = m.ID, i
		l := ownedBy(m.Target, map[string]string{"merge": m.ID})
		if err := s.insert(ctx, tableConflicts, pairKey(m.ID, c.ID), int64(i), l, c); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "create merge %s: conflict %s", m.ID, c.ID)
		}
	}
	return nil
}

// GetMerge reads one merge.
func (s *Store) GetMerge(ctx context.Context, id string) (store.Merge, error) {
	var m store.Merge
	if _, err := s.get(ctx, tableMerges, id, &m); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Merge{}, errs.E(errs.NotFound, "merge %s not found", id)
		}
		return store.Merge{}, err
	}
	return m, nil
}

// ListMerges lists the merges into target ("" = all), oldest first.
func (s *Store) ListMerges(ctx context.Context, target string) ([]store.Merge, error) {
	match := map[string]string{}
	if target != "" {
		match["target"] = target
	}
	rows, err := s.list(ctx, tableMerges, match)
	if err != nil {
		return nil, err
	}
	out := []store.Merge{}
	for _, r := range rows {
		var m store.Merge
		if err := r.decode(&m); err != nil {
			return nil, err
		}
		if target == "" || m.Target == target {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b store.Merge) int {
		return cmpKey(a.CreatedAt.UnixNano(), a.ID, b.CreatedAt.UnixNano(), b.ID)
	})
	return out, nil
}

// UpdateMerge changes an open merge (conditional on what was read); when
// it leaves the open states it then releases its target.
func (s *Store) UpdateMerge(ctx context.Context, m store.Merge) error {
	if m.UpdatedAt.IsZero() {
		m.UpdatedAt = s.now().UTC()
	}
	var cur store.Merge
	err := s.update(ctx, tableMerges, m.ID, &cur, func() map[string]string {
		return ownedBy(cur.Target, map[string]string{"target": cur.Target})
	}, func() error {
		if !cur.Open() {
			return errs.E(errs.Conflict, "merge %s is %s; it can no longer change", m.ID, cur.State)
		}
		cur.State, cur.Plan, cur.Result, cur.Reason, cur.UpdatedAt = m.State, m.Plan, m.Result, m.Reason, m.UpdatedAt
		return nil
	})
	if errs.Is(err, errs.NotFound) {
		return errs.E(errs.NotFound, "merge %s not found", m.ID)
	}
	if err != nil {
		return err
	}
	if !cur.Open() {
		return s.release(ctx, tableMergeOpen, cur.Target, cur.ID)
	}
	return nil
}

// ListMergeConflicts lists a merge's conflicts in plan order.
func (s *Store) ListMergeConflicts(ctx context.Context, mergeID string) ([]store.MergeConflict, error) {
	rows, err := s.list(ctx, tableConflicts, map[string]string{"merge": mergeID})
	if err != nil {
		return nil, err
	}
	out := []store.MergeConflict{}
	for _, r := range rows {
		var c store.MergeConflict
		if err := r.decode(&c); err != nil {
			return nil, err
		}
		if c.MergeID == mergeID {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b store.MergeConflict) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// ResolveMergeConflict writes the plan first and the resolution after
// (each conditional): a crash in between leaves the conflict unresolved
// and the call can be made again, never a resolution the plan lacks.
func (s *Store) ResolveMergeConflict(ctx context.Context, mergeID, conflictID string, resolution, plan []byte) error {
	if len(resolution) == 0 {
		return errs.Field("resolution", "must not be empty")
	}
	key := pairKey(mergeID, conflictID)
	var c store.MergeConflict
	r, err := s.get(ctx, tableConflicts, key, &c)
	if errs.Is(err, errs.NotFound) {
		return errs.E(errs.NotFound, "no conflict %s in merge %s", conflictID, mergeID)
	}
	if err != nil {
		return err
	}
	if len(c.Resolution) != 0 {
		return errs.E(errs.Conflict, "conflict %s is already resolved", conflictID)
	}
	var m store.Merge
	err = s.update(ctx, tableMerges, mergeID, &m, func() map[string]string {
		return ownedBy(m.Target, map[string]string{"target": m.Target})
	}, func() error {
		if !m.Open() {
			return errs.E(errs.Conflict, "merge %s is no longer open", mergeID)
		}
		m.Plan, m.UpdatedAt = plan, s.now().UTC()
		return nil
	})
	if errs.Is(err, errs.NotFound) {
		return errs.E(errs.NotFound, "merge %s not found", mergeID)
	}
	if err != nil {
		return err
	}
	c.Resolution = resolution
	err = s.replace(ctx, r, ownedBy(m.Target, map[string]string{"merge": mergeID}), c)
	if errs.Is(err, errs.Conflict) {
		return errs.E(errs.Conflict, "conflict %s was resolved concurrently", conflictID)
	}
	return err
}

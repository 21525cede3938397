package kubestore

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/store"
)

// Snapshots, checkpoints and timeline heads are records. A name that must
// be unique (a snapshot's per owner, a checkpoint's per sandbox) is a
// claim record keyed by the pair, written after the row it names and
// removed before it: a crash in between leaves a claim whose holder is
// gone, which the next claim of that name takes over (claim's stale).
const (
	tableSnapshots     = "snapshots"
	tableSnapshotNames = "snapshotnames"
	tableCheckpoints   = "checkpoints"
	tableCkptNames     = "checkpointnames"
	tableHeads         = "timelineheads"
)

var rowIDRe = lazyregexp.New(`^[a-z0-9]{1,64}$`)

// CreateSnapshot inserts the snapshot's row, then claims its name.
func (s *Store) CreateSnapshot(ctx context.Context, sn store.Snapshot) error {
	if !rowIDRe.MatchString(sn.ID) {
		return errs.Field("id", "snapshot id must be 1-64 chars of [a-z0-9], got %q", sn.ID)
	}
	if sn.Owner == "" {
		return errs.Field("owner", "must not be empty")
	}
	if len(sn.Layers) == 0 {
		return errs.Field("layers", "a snapshot needs at least one layer")
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = s.now().UTC()
	}
	if err := s.insert(ctx, tableSnapshots, sn.ID, 0, map[string]string{"owner": sn.Owner}, sn); err != nil {
		if errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "snapshot %s already exists", sn.ID)
		}
		return err
	}
	if sn.Name == "" {
		return nil
	}
	err := s.claim(ctx, tableSnapshotNames, pairKey(sn.Owner, sn.Name), sn.ID, nil, func(other string) (bool, error) {
		_, err := s.GetSnapshot(ctx, other)
		if errs.Is(err, errs.NotFound) {
			return true, nil
		}
		return false, err
	})
	if err == nil {
		return nil
	}
	if rerr := s.remove(ctx, tableSnapshots, sn.ID); rerr != nil && !errs.Is(rerr, errs.NotFound) {
		return errs.Wrap(errs.KindOf(err), err, "create snapshot %s (and undo it: %v)", sn.ID, rerr)
	}
	if errs.Is(err, errs.AlreadyExists) {
		return errs.E(errs.AlreadyExists, "snapshot name %q of %s already exists", sn.Name, sn.Owner)
	}
	return err
}

// GetSnapshot reads one snapshot.
func (s *Store) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	var sn store.Snapshot
	if _, err := s.get(ctx, tableSnapshots, id, &sn); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Snapshot{}, errs.E(errs.NotFound, "snapshot %s not found", id)
		}
		return store.Snapshot{}, err
	}
	return sn, nil
}

// ListSnapshots lists owner's snapshots ("" = all), oldest first.
func (s *Store) ListSnapshots(ctx context.Context, owner string) ([]store.Snapshot, error) {
	match := map[string]string{}
	if owner != "" {
		match["owner"] = owner
	}
	rows, err := s.list(ctx, tableSnapshots, match)
	if err != nil {
		return nil, err
	}
	out := []store.Snapshot{}
	for _, r := range rows {
		var sn store.Snapshot
		if err := r.decode(&sn); err != nil {
			return nil, err
		}
		if owner == "" || sn.Owner == owner {
			out = append(out, sn)
		}
	}
	slices.SortFunc(out, func(a, b store.Snapshot) int {
		return cmpKey(a.CreatedAt.UnixNano(), a.ID, b.CreatedAt.UnixNano(), b.ID)
	})
	return out, nil
}

// DeleteSnapshot releases the name, then removes the row.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	sn, err := s.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	if sn.Name != "" {
		if err := s.release(ctx, tableSnapshotNames, pairKey(sn.Owner, sn.Name), sn.ID); err != nil {
			return err
		}
	}
	if err := s.remove(ctx, tableSnapshots, id); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "snapshot %s not found", id)
		}
		return err
	}
	return nil
}

// CreateCheckpoint takes the next seq of the sandbox's own counter (never
// reused, and deleted with the sandbox), inserts the row, then claims the
// name. Every record of it goes with its sandbox.
func (s *Store) CreateCheckpoint(ctx context.Context, c store.Checkpoint) (store.Checkpoint, error) {
	switch {
	case !rowIDRe.MatchString(c.ID):
		return store.Checkpoint{}, errs.Field("id", "checkpoint id must be 1-64 chars of [a-z0-9], got %q", c.ID)
	case c.Sandbox == "":
		return store.Checkpoint{}, errs.Field("sandbox", "must not be empty")
	case c.Owner == "":
		return store.Checkpoint{}, errs.Field("owner", "must not be empty")
	case c.Layer == "" || len(c.Layers) == 0 || c.Layers[0] != c.Layer:
		return store.Checkpoint{}, errs.Field("layers", "a checkpoint's view must start with its delta layer")
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = s.now().UTC()
	}
	// A duplicate id is refused before a seq is spent on it.
	if _, err := s.GetCheckpoint(ctx, c.ID); err == nil {
		return store.Checkpoint{}, errs.E(errs.AlreadyExists, "checkpoint %s already exists", c.ID)
	} else if !errs.Is(err, errs.NotFound) {
		return store.Checkpoint{}, err
	}
	if c.Name != "" { // likewise a taken name
		var other string
		if _, err := s.get(ctx, tableCkptNames, pairKey(c.Sandbox, c.Name), &other); err == nil {
			if _, err := s.GetCheckpoint(ctx, other); err == nil {
				return store.Checkpoint{}, errs.E(errs.AlreadyExists, "sandbox %s has a checkpoint named %q", c.Sandbox, c.Name)
			}
		}
	}
	owned := ownedBy(c.Sandbox, nil)
	seq, err := s.nextSeqOwned(ctx, tableCheckpoints+"/"+c.Sandbox, 1, owned)
	if err != nil {
		return store.Checkpoint{}, err
	}
	c.Seq = seq
	labels := ownedBy(c.Sandbox, map[string]string{"sandbox": c.Sandbox, "owner": c.Owner})
	if err := s.insert(ctx, tableCheckpoints, c.ID, seq, labels, c); err != nil {
		if errs.Is(err, errs.AlreadyExists) {
			return store.Checkpoint{}, errs.E(errs.AlreadyExists, "checkpoint %s already exists", c.ID)
		}
		return store.Checkpoint{}, err
	}
	if c.Name == "" {
		return c, nil
	}
	err = s.claim(ctx, tableCkptNames, pairKey(c.Sandbox, c.Name), c.ID, owned, func(other string) (bool, error) {
		_, err := s.GetCheckpoint(ctx, other)
		if errs.Is(err, errs.NotFound) {
			return true, nil
		}
		return false, err
	})
	if err == nil {
		return c, nil
	}
	if rerr := s.remove(ctx, tableCheckpoints, c.ID); rerr != nil && !errs.Is(rerr, errs.NotFound) {
		return store.Checkpoint{}, errs.Wrap(errs.KindOf(err), err, "create checkpoint %s (and undo it: %v)", c.ID, rerr)
	}
	if errs.Is(err, errs.AlreadyExists) {
		return store.Checkpoint{}, errs.E(errs.AlreadyExists, "sandbox %s has a checkpoint named %q", c.Sandbox, c.Name)
	}
	return store.Checkpoint{}, err
}

// GetCheckpoint reads one checkpoint.
func (s *Store) GetCheckpoint(ctx context.Context, id string) (store.Checkpoint, error) {
	var c store.Checkpoint
	if _, err := s.get(ctx, tableCheckpoints, id, &c); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Checkpoint{}, errs.E(errs.NotFound, "checkpoint %s not found", id)
		}
		return store.Checkpoint{}, err
	}
	return c, nil
}

func (s *Store) listCheckpoints(ctx context.Context, label, value string) ([]store.Checkpoint, error) {
	match := map[string]string{}
	if value != "" {
		match[label] = value
	}
	rows, err := s.list(ctx, tableCheckpoints, match)
	if err != nil {
		return nil, err
	}
	out := []store.Checkpoint{}
	for _, r := range rows {
		var c store.Checkpoint
		if err := r.decode(&c); err != nil {
			return nil, err
		}
		if value == "" || (label == "sandbox" && c.Sandbox == value) || (label == "owner" && c.Owner == value) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b store.Checkpoint) int {
		if c := strings.Compare(a.Sandbox, b.Sandbox); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	return out, nil
}

// ListCheckpoints lists a sandbox's checkpoints by seq ("" = all, by sandbox then seq).
func (s *Store) ListCheckpoints(ctx context.Context, sandboxID string) ([]store.Checkpoint, error) {
	return s.listCheckpoints(ctx, "sandbox", sandboxID)
}

// CountCheckpoints counts owner's checkpoints.
func (s *Store) CountCheckpoints(ctx context.Context, owner string) (int, error) {
	if owner == "" {
		return 0, nil
	}
	cs, err := s.listCheckpoints(ctx, "owner", owner)
	return len(cs), err
}

// DeleteCheckpoint releases the name, then removes the row.
func (s *Store) DeleteCheckpoint(ctx context.Context, id string) error {
	c, err := s.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	if c.Name != "" {
		if err := s.release(ctx, tableCkptNames, pairKey(c.Sandbox, c.Name), c.ID); err != nil {
			return err
		}
	}
	if err := s.remove(ctx, tableCheckpoints, id); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "checkpoint %s not found", id)
		}
		return err
	}
	return nil
}

// SetTimelineHead replaces a sandbox's head.
func (s *Store) SetTimelineHead(ctx context.Context, h store.TimelineHead) error {
	if h.Sandbox == "" {
		return errs.Field("sandbox", "must not be empty")
	}
	return s.upsert(ctx, tableHeads, h.Sandbox, 0, ownedBy(h.Sandbox, nil), h)
}

// GetTimelineHead reads a sandbox's head (NotFound if none).
func (s *Store) GetTimelineHead(ctx context.Context, sandboxID string) (store.TimelineHead, error) {
	var h store.TimelineHead
	if _, err := s.get(ctx, tableHeads, sandboxID, &h); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.TimelineHead{}, errs.E(errs.NotFound, "sandbox %s has no timeline head", sandboxID)
		}
		return store.TimelineHead{}, err
	}
	return h, nil
}

// ListTimelineHeads lists every head by sandbox.
func (s *Store) ListTimelineHeads(ctx context.Context) ([]store.TimelineHead, error) {
	rows, err := s.list(ctx, tableHeads, nil)
	if err != nil {
		return nil, err
	}
	out := []store.TimelineHead{}
	for _, r := range rows {
		var h store.TimelineHead
		if err := r.decode(&h); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b store.TimelineHead) int { return strings.Compare(a.Sandbox, b.Sandbox) })
	return out, nil
}

// DeleteTimelineHead removes a sandbox's head (NotFound if none).
func (s *Store) DeleteTimelineHead(ctx context.Context, sandboxID string) error {
	if err := s.remove(ctx, tableHeads, sandboxID); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "sandbox %s has no timeline head", sandboxID)
		}
		return err
	}
	return nil
}

package kubestore

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

const (
	tableLease = "lease" // key lease id
	// tableLeasePh claims a placeholder (key): creating the claim is what
	// makes a placeholder unique across leases, as SQLite's UNIQUE index.
	tableLeasePh = "leaseph"
)

type leaseRow struct {
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox"`
	Owner       string    `json:"owner"`
	Generation  int       `json:"generation"`
	Secret      string    `json:"secret"`
	Host        string    `json:"host,omitempty"`
	Header      string    `json:"header,omitempty"`
	Placeholder string    `json:"placeholder"`
	IssuedAt    time.Time `json:"issuedAt"`
	ExpiresAt   time.Time `json:"expiresAt"`
	State       string    `json:"state"`
	Reason      string    `json:"reason,omitempty"`
	ChangedAt   time.Time `json:"changedAt"`
}

func leaseLabels(l leaseRow) map[string]string {
	return map[string]string{labelSandbox: l.SandboxID, labelWithSandbox: l.SandboxID, "berth.dev/owner": l.Owner,
		labelPlaceh: l.Placeholder}
}

func validLeaseState(s string) bool {
	return s == store.LeaseActive || s == store.LeaseFrozen || s == store.LeaseRevoked
}

// sandboxUpdater is kstore-a's UpdateSandbox, which ApplyLeases needs for
// its sandbox fn; found on the Store at run time, so this file builds
// before that one exists (the merge may call s.UpdateSandbox directly).
type sandboxUpdater interface {
	UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
}

// ApplyLeases changes and issues a sandbox's leases, then its row.
func (s *Store) ApplyLeases(ctx context.Context, sandboxID string, set []store.LeaseUpdate, issue []store.Lease, sb func(*sandbox.Sandbox) bool) error {
	var upd func(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	if u, ok := any(s).(sandboxUpdater); ok {
		upd = u.UpdateSandbox
	}
	return s.applyLeases(ctx, sandboxID, set, issue, sb, upd)
}

// TransitionLeases applies ch, then the transition (no transaction across
// objects): the move is checked first, so an illegal one writes no lease;
// a crash in between leaves the sandbox in its old state with the new
// leases, which that state (resuming) freezes.
func (s *Store) TransitionLeases(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error) {
	sb, err := s.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := sandbox.Transition(sb.State, to); err != nil {
		return nil, err
	}
	if ch.Seen >= 0 {
		ls, err := s.ListLeases(ctx, store.LeaseFilter{SandboxID: id})
		if err != nil {
			return nil, err
		}
		if len(ls) != ch.Seen {
			return nil, errs.E(errs.Conflict, "the leases of %s changed since the change was planned (%d, then %d)", id, ch.Seen, len(ls))
		}
	}
	if err := s.applyLeases(ctx, id, ch.Set, ch.Issue, nil, nil); err != nil {
		return nil, err
	}
	return s.Transition(ctx, id, to, ev, fn)
}

var errNoChange = errors.New("kubestore: sandbox unchanged")

// applyLeases: all or nothing without a transaction. Everything that can
// refuse is read and checked before the first write; then the
// placeholders are claimed, the state changes written (revocations before
// the new leases: a crash in between leaves a sandbox with fewer usable
// secrets, never two generations live at once), the new leases created
// and the sandbox's row written; a failure on the way undoes the writes
// before it.
func (s *Store) applyLeases(ctx context.Context, sandboxID string, set []store.LeaseUpdate, issue []store.Lease,
	sbFn func(*sandbox.Sandbox) bool, upd func(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)) error {
	if sandboxID == "" {
		return errs.Field("sandbox_id", "must not be empty")
	}
	for _, u := range set {
		if !validLeaseState(u.State) {
			return errs.Field("state", "must be active, frozen or revoked, got %q", u.State)
		}
	}
	for _, l := range issue {
		switch {
		case l.ID == "":
			return errs.Field("id", "must not be empty")
		case l.SandboxID != sandboxID:
			return errs.Field("sandbox_id", "lease %s is of sandbox %q, not %q", l.ID, l.SandboxID, sandboxID)
		case l.Owner == "" || l.Secret == "" || l.Placeholder == "":
			return errs.Field("lease", "owner, secret and placeholder must not be empty")
		case !validLeaseState(l.State):
			return errs.Field("state", "must be active, frozen or revoked, got %q", l.State)
		}
	}
	if sbFn != nil && upd == nil {
		return errs.E(errs.Internal, "kubernetes store: ApplyLeases needs UpdateSandbox")
	}
	// Read and check.
	type change struct {
		r row
		l leaseRow
		u store.LeaseUpdate
	}
	changes := make([]change, len(set))
	if err := each(len(set), func(i int) error {
		u := set[i]
		var l leaseRow
		r, err := s.get(ctx, tableLease, u.ID, &l)
		if errs.Is(err, errs.NotFound) || (err == nil && l.SandboxID != sandboxID) {
			return errs.E(errs.NotFound, "lease %s not found", u.ID)
		}
		if err != nil {
			return err
		}
		if l.State == store.LeaseRevoked && u.State != store.LeaseRevoked {
			return errs.E(errs.FailedPrecondition, "lease %s is revoked: it never becomes %s again", u.ID, u.State)
		}
		changes[i] = change{r, l, u}
		return nil
	}); err != nil {
		return err
	}
	var u undo
	fail := func(err error) error { u.run(ctx); return err }
	// Claim the placeholders.
	if err := each(len(issue), func(i int) error {
		l := issue[i]
		rec, err := s.create(ctx, tableLeasePh, l.Placeholder, 0, map[string]string{labelWithSandbox: sandboxID}, l.ID)
		if errs.Is(err, errs.AlreadyExists) {
			// Ours when an interrupted earlier call of this lease left it
			// (then creating the lease below decides); else another's.
			var owner string
			if _, gerr := s.get(ctx, tableLeasePh, l.Placeholder, &owner); gerr == nil && owner == l.ID {
				return nil
			}
			return errs.E(errs.AlreadyExists, "lease %s: placeholder is another lease's", l.ID)
		}
		if err == nil {
			u.push(func(ctx context.Context) { s.deleteRow(ctx, rec) })
		}
		return err
	}); err != nil {
		return fail(err)
	}
	// State changes, moving forward only.
	for _, c := range changes {
		for c.l.State != store.LeaseRevoked { // a revoked lease keeps its first reason
			at := c.u.At
			if at.IsZero() {
				at = time.Now().UTC()
			}
			before := c.r
			next := c.l
			next.State, next.Reason, next.ChangedAt = c.u.State, c.u.Reason, at
			rec, err := s.put(ctx, c.r, leaseLabels(next), next)
			if err == nil {
				u.push(func(ctx context.Context) {
					var old leaseRow
					if before.decode(&old) == nil {
						before.ResourceVersion = rec.ResourceVersion
						_, _ = s.put(ctx, before, leaseLabels(old), old)
					}
				})
				break
			}
			if !errs.Is(err, errs.Conflict) {
				return fail(err)
			}
			// Changed meanwhile: read again and re-check.
			r, err := s.get(ctx, tableLease, c.u.ID, &c.l)
			if err != nil {
				return fail(err)
			}
			c.r = r
			if c.l.State == store.LeaseRevoked && c.u.State != store.LeaseRevoked {
				return fail(errs.E(errs.FailedPrecondition, "lease %s is revoked: it never becomes %s again", c.u.ID, c.u.State))
			}
		}
	}
	// New leases.
	if err := each(len(issue), func(i int) error {
		l := issue[i]
		if l.IssuedAt.IsZero() {
			l.IssuedAt = time.Now().UTC()
		}
		if l.ChangedAt.IsZero() {
			l.ChangedAt = l.IssuedAt
		}
		lr := leaseRow(l)
		rec, err := s.create(ctx, tableLease, l.ID, 0, leaseLabels(lr), lr)
		if errs.Is(err, errs.AlreadyExists) {
			return errs.E(errs.AlreadyExists, "lease %s already exists", l.ID)
		}
		if err == nil {
			u.push(func(ctx context.Context) { s.deleteRow(ctx, rec) })
		}
		return err
	}); err != nil {
		return fail(err)
	}
	if sbFn != nil {
		_, err := upd(ctx, sandboxID, func(sb *sandbox.Sandbox) error {
			if !sbFn(sb) {
				return errNoChange
			}
			return nil
		})
		if err != nil && !errors.Is(err, errNoChange) {
			return fail(err)
		}
	}
	return nil
}

// GetLease returns one lease by id.
func (s *Store) GetLease(ctx context.Context, id string) (store.Lease, error) {
	var l leaseRow
	if _, err := s.get(ctx, tableLease, id, &l); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Lease{}, errs.E(errs.NotFound, "lease %s not found", id)
		}
		return store.Lease{}, err
	}
	return store.Lease(l), nil
}

// ListLeases lists matching leases by issue time, then generation, then id.
func (s *Store) ListLeases(ctx context.Context, f store.LeaseFilter) ([]store.Lease, error) {
	match := map[string]string{}
	if f.SandboxID != "" {
		match[labelSandbox] = f.SandboxID
	}
	if f.Owner != "" {
		match["berth.dev/owner"] = f.Owner
	}
	if f.Placeholder != "" {
		match[labelPlaceh] = f.Placeholder
	}
	rs, err := s.list(ctx, tableLease, match)
	if err != nil {
		return nil, err
	}
	ls, _, err := decodeRows[leaseRow](rs, tableLease)
	if err != nil {
		return nil, err
	}
	out := []store.Lease{}
	for _, l := range ls {
		if (f.SandboxID == "" || l.SandboxID == f.SandboxID) && (f.Owner == "" || l.Owner == f.Owner) &&
			(f.Placeholder == "" || l.Placeholder == f.Placeholder) {
			out = append(out, store.Lease(l))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.IssuedAt.Equal(b.IssuedAt) {
			return a.IssuedAt.Before(b.IssuedAt)
		}
		if a.Generation != b.Generation {
			return a.Generation < b.Generation
		}
		return a.ID < b.ID
	})
	return out, nil
}

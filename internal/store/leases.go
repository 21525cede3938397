package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Lease states (internal/leases): only an active lease is injected by the
// egress proxy; revoked is final.
const (
	LeaseActive  = "active"
	LeaseFrozen  = "frozen"
	LeaseRevoked = "revoked"
)

// Lease is a secret issued to one generation of one sandbox
// (internal/leases): inside the sandbox the env var Secret holds
// Placeholder, and the proxy injects the secret on requests to Host only
// while the lease is active.
type Lease struct {
	ID          string
	SandboxID   string
	Owner       string
	Generation  int // 1, 2, ... per sandbox: each resume, fork and restore is a new one
	Secret      string
	Host        string // scope: the host the secret is injected for
	Header      string // scope: the header it is injected into
	Placeholder string // unique across every lease
	IssuedAt    time.Time
	ExpiresAt   time.Time // zero: lives as long as the sandbox
	State       string    // LeaseActive, LeaseFrozen or LeaseRevoked
	Reason      string    // why the state was last changed (machine word)
	ChangedAt   time.Time
}

// LeaseUpdate changes one lease's state.
type LeaseUpdate struct {
	ID     string
	State  string
	Reason string
	At     time.Time
}

// LeaseChange is a change of one sandbox's leases planned from a read of
// them (TransitionLeases).
type LeaseChange struct {
	Set   []LeaseUpdate
	Issue []Lease
	// Seen is how many leases the sandbox had when the change was planned:
	// the write is a Conflict if it has another number by then (another
	// change came in between; leases are only ever added). -1: unchecked.
	Seen int
}

// LeaseFilter selects leases; zero fields match everything.
type LeaseFilter struct {
	SandboxID   string
	Owner       string
	Placeholder string
}

// LeaseStore holds credential leases. Deleting a sandbox deletes its leases.
type LeaseStore interface {
	// ApplyLeases changes leases of sandboxID (set) and inserts new ones
	// (issue) in one transaction: a lease's new state moves it forward only
	// (a revoked lease never changes again: FailedPrecondition), an id of
	// another sandbox is NotFound, a duplicate id or placeholder
	// AlreadyExists. sb (may be nil) changes the sandbox's row in the same
	// transaction (its env and grants follow its leases): when it returns
	// true the row is written back (Version incremented).
	ApplyLeases(ctx context.Context, sandboxID string, set []LeaseUpdate, issue []Lease, sb func(*sandbox.Sandbox) bool) error
	// TransitionLeases is Transition of sandbox id (fn also sets its env and
	// grants) with ch applied to its leases as ApplyLeases does, in one
	// transaction where the backend has them (a resume's state and its
	// leases' next generation: one durable commit). A backend without
	// transactions writes the leases first, then the state (a crash in
	// between leaves the sandbox in its old state with the new leases, which
	// that state freezes).
	TransitionLeases(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error, ch LeaseChange) (*sandbox.Sandbox, error)
	GetLease(ctx context.Context, id string) (Lease, error)
	// ListLeases lists matching leases by issue time, then generation, then id.
	ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error)
}

const leaseCols = `id, sandbox_id, owner, generation, secret, host, header, placeholder, issued_at, expires_at, state, reason, changed_at`

func validLeaseState(s string) bool {
	return s == LeaseActive || s == LeaseFrozen || s == LeaseRevoked
}

// ApplyLeases updates and inserts a sandbox's leases at once.
func (s *stateTables) ApplyLeases(ctx context.Context, sandboxID string, set []LeaseUpdate, issue []Lease, sbFn func(*sandbox.Sandbox) bool) error {
	if err := checkLeaseChange(sandboxID, set, issue); err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		if err := applyLeasesTx(ctx, tx, sandboxID, LeaseChange{Set: set, Issue: issue, Seen: -1}); err != nil {
			return err
		}
		if sbFn == nil {
			return nil
		}
		sb, err := getSandbox(ctx, tx, sandboxID)
		if err != nil {
			return err
		}
		if !sbFn(sb) {
			return nil
		}
		return putSandbox(ctx, tx, sandboxID, sb.Version, sb)
	})
}

// TransitionLeases writes ch and the transition in one transaction.
func (s *stateTables) TransitionLeases(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error, ch LeaseChange) (*sandbox.Sandbox, error) {
	if err := checkLeaseChange(id, ch.Set, ch.Issue); err != nil {
		return nil, err
	}
	var out *sandbox.Sandbox
	err := s.write(ctx, func(tx *sql.Tx) (err error) {
		if err := applyLeasesTx(ctx, tx, id, ch); err != nil {
			return err
		}
		out, err = transitionTx(ctx, tx, id, to, ev, fn)
		return err
	})
	return out, err
}

// checkLeaseChange refuses a malformed change before any write.
func checkLeaseChange(sandboxID string, set []LeaseUpdate, issue []Lease) error {
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
	return nil
}

// applyLeasesTx writes a checked change in tx.
func applyLeasesTx(ctx context.Context, tx *sql.Tx, sandboxID string, ch LeaseChange) error {
	if ch.Seen >= 0 {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM leases WHERE sandbox_id = ?`, sandboxID).Scan(&n); err != nil {
			return dbErr(err, "store: count leases of %s", sandboxID)
		}
		if n != ch.Seen {
			return errs.E(errs.Conflict, "the leases of %s changed since the change was planned (%d, then %d)", sandboxID, ch.Seen, n)
		}
	}
	for _, u := range ch.Set {
		var sb, state string
		err := tx.QueryRowContext(ctx, `SELECT sandbox_id, state FROM leases WHERE id = ?`, u.ID).Scan(&sb, &state)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && sb != sandboxID) {
			return errs.E(errs.NotFound, "lease %s not found", u.ID)
		}
		if err != nil {
			return dbErr(err, "store: get lease %s", u.ID)
		}
		if state == LeaseRevoked && u.State != LeaseRevoked {
			return errs.E(errs.FailedPrecondition, "lease %s is revoked: it never becomes %s again", u.ID, u.State)
		}
		if state == LeaseRevoked {
			continue // already final: keep its first reason
		}
		at := u.At
		if at.IsZero() {
			at = time.Now().UTC()
		}
		if _, err := tx.ExecContext(ctx, `UPDATE leases SET state = ?, reason = ?, changed_at = ? WHERE id = ?`,
			u.State, u.Reason, toNanos(at), u.ID); err != nil {
			return dbErr(err, "store: update lease %s", u.ID)
		}
	}
	for _, l := range ch.Issue {
		if l.IssuedAt.IsZero() {
			l.IssuedAt = time.Now().UTC()
		}
		if l.ChangedAt.IsZero() {
			l.ChangedAt = l.IssuedAt
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO leases (`+leaseCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			l.ID, l.SandboxID, l.Owner, l.Generation, l.Secret, l.Host, l.Header, l.Placeholder,
			toNanos(l.IssuedAt), toNanos(l.ExpiresAt), l.State, l.Reason, toNanos(l.ChangedAt)); err != nil {
			return dbErr(err, "store: issue lease %s", l.ID)
		}
	}
	return nil
}

func scanLease(sc scanner) (Lease, error) {
	var l Lease
	var issued, expires, changed int64
	if err := sc.Scan(&l.ID, &l.SandboxID, &l.Owner, &l.Generation, &l.Secret, &l.Host, &l.Header, &l.Placeholder,
		&issued, &expires, &l.State, &l.Reason, &changed); err != nil {
		return Lease{}, err
	}
	l.IssuedAt, l.ExpiresAt, l.ChangedAt = fromNanos(issued), fromNanos(expires), fromNanos(changed)
	return l, nil
}

// GetLease returns one lease by id.
func (s *stateTables) GetLease(ctx context.Context, id string) (Lease, error) {
	l, err := scanLease(s.r.QueryRowContext(ctx, `SELECT `+leaseCols+` FROM leases WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Lease{}, errs.E(errs.NotFound, "lease %s not found", id)
	}
	if err != nil {
		return Lease{}, dbErr(err, "store: get lease %s", id)
	}
	return l, nil
}

// ListLeases lists matching leases, oldest first.
func (s *stateTables) ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	q := `SELECT ` + leaseCols + ` FROM leases WHERE 1 = 1`
	var args []any
	for _, c := range []struct{ col, v string }{{"sandbox_id", f.SandboxID}, {"owner", f.Owner}, {"placeholder", f.Placeholder}} {
		if c.v != "" {
			q += ` AND ` + c.col + ` = ?`
			args = append(args, c.v)
		}
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY issued_at, generation, id`, args...)
	if err != nil {
		return nil, dbErr(err, "store: list leases")
	}
	defer rows.Close()
	out := []Lease{}
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, dbErr(err, "store: list leases")
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(err, "store: list leases")
	}
	return out, nil
}

// deleteLeases removes a sandbox's leases, in the transaction that deletes
// the sandbox.
func deleteLeases(ctx context.Context, tx *sql.Tx, sandboxID string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM leases WHERE sandbox_id = ?`, sandboxID); err != nil {
		return dbErr(err, "store: delete leases of %s", sandboxID)
	}
	return nil
}

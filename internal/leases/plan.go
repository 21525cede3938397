package leases

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Op is what a lifecycle moment does to a sandbox's leases (docs/STATE.md).
type Op string

const (
	// OpEnsure issues a lease for each granted secret that has none yet:
	// at create, for a fork's child, for a sandbox created from a snapshot,
	// and for one that predates leases. A ref's placeholder is kept unless
	// another sandbox's lease holds it (a fork inherits its parent's env).
	OpEnsure Op = "ensure"
	// OpReissue revokes every lease and issues the next generation with
	// fresh placeholders (resume, rewind).
	OpReissue Op = "reissue"
)

// Reasons a lease's state changed (store.Lease.Reason).
const (
	ReasonIssued   = "issued"
	ReasonPaused   = "paused"
	ReasonResumed  = "resumed"
	ReasonRestored = "restored"
	ReasonRevoked  = "revoked" // by a principal over the API: the grant is withdrawn
	ReasonExpired  = "expired"
)

// Scope is where a secret is injected: its host and header name.
type Scope struct{ Host, Header string }

// Input is everything Plan decides on.
type Input struct {
	Sandbox, Owner string
	Refs           []sandbox.SecretGrant // the sandbox's granted secrets
	Leases         []store.Lease         // the sandbox's leases, any order
	Scopes         map[string]Scope      // by secret; a secret missing here (deleted) gets no new lease
	// Taken reports a placeholder held by another sandbox's lease.
	Taken  func(placeholder string) bool
	TTL    time.Duration // 0: a lease lives as long as the sandbox
	Now    time.Time
	Reason string // of a reissue's revocations (ReasonResumed, ReasonRestored)
	NewID  func() string
	// NewPlaceholder makes a fresh placeholder for a secret (egress.NewPlaceholder).
	NewPlaceholder func(secret string) string
}

// Change is what Plan decided: state changes and new leases, applied in one
// store transaction (store.ApplyLeases).
type Change struct {
	Set   []store.LeaseUpdate
	Issue []store.Lease
}

// Empty reports a change that changes nothing.
func (c Change) Empty() bool { return len(c.Set) == 0 && len(c.Issue) == 0 }

// Generation is the sandbox's current lease generation (0: none issued).
func Generation(ls []store.Lease) int {
	g := 0
	for _, l := range ls {
		g = max(g, l.Generation)
	}
	return g
}

// Plan is the pure lease transition of op.
func Plan(op Op, in Input) Change {
	var c Change
	latest := map[string]store.Lease{} // per secret, its highest generation
	for _, l := range in.Leases {
		if cur, ok := latest[l.Secret]; !ok || l.Generation > cur.Generation ||
			(l.Generation == cur.Generation && l.IssuedAt.After(cur.IssuedAt)) {
			latest[l.Secret] = l
		}
	}
	gen := Generation(in.Leases)
	issue := func(ref sandbox.SecretGrant, gen int, keep bool) {
		sc, ok := in.Scopes[ref.Name]
		if !ok {
			return
		}
		ph := ref.Placeholder
		if !keep || ph == "" || (in.Taken != nil && in.Taken(ph)) {
			ph = in.NewPlaceholder(ref.Name)
		}
		l := store.Lease{ID: in.NewID(), SandboxID: in.Sandbox, Owner: in.Owner, Generation: gen, Secret: ref.Name,
			Host: sc.Host, Header: sc.Header, Placeholder: ph, IssuedAt: in.Now, State: store.LeaseActive,
			Reason: ReasonIssued, ChangedAt: in.Now}
		if in.TTL > 0 {
			l.ExpiresAt = in.Now.Add(in.TTL)
		}
		c.Issue = append(c.Issue, l)
	}
	switch op {
	case OpEnsure:
		if gen == 0 {
			gen = 1
		}
		for _, ref := range uniqueRefs(in.Refs) {
			if _, ok := latest[ref.Name]; ok {
				continue // issued before; a revoked one is never revived here
			}
			issue(ref, gen, true)
		}
	case OpReissue:
		for _, l := range in.Leases {
			if l.State != store.LeaseRevoked {
				c.Set = append(c.Set, store.LeaseUpdate{ID: l.ID, State: store.LeaseRevoked, Reason: in.Reason, At: in.Now})
			}
		}
		for _, ref := range uniqueRefs(in.Refs) {
			issue(ref, gen+1, false)
		}
	}
	return c
}

func uniqueRefs(refs []sandbox.SecretGrant) []sandbox.SecretGrant {
	var out []sandbox.SecretGrant
	for _, r := range refs {
		if !slices.ContainsFunc(out, func(o sandbox.SecretGrant) bool { return o.Name == r.Name }) {
			out = append(out, r)
		}
	}
	return out
}

// After is ls with ch applied (as store.ApplyLeases does: revoked is final).
func After(ls []store.Lease, ch Change) []store.Lease {
	out := slices.Clone(ls)
	for _, u := range ch.Set {
		for i := range out {
			if out[i].ID == u.ID && out[i].State != store.LeaseRevoked {
				out[i].State, out[i].Reason, out[i].ChangedAt = u.State, u.Reason, u.At
			}
		}
	}
	return append(out, ch.Issue...)
}

// SetPlaceholders makes sb's env and secret grants hold the current
// placeholders, and removes the grant of secret withdraw ("": none; its
// env var keeps the revoked placeholder). It reports whether sb changed.
func SetPlaceholders(sb *sandbox.Sandbox, current map[string]string, withdraw string) bool {
	changed := false
	refs := sb.Net.Secrets[:0:0]
	for _, r := range sb.Net.Secrets {
		if withdraw != "" && r.Name == withdraw {
			changed = true
			continue
		}
		if ph, ok := current[r.Name]; ok {
			if r.Placeholder != ph {
				r.Placeholder, changed = ph, true
			}
			if sb.Env[r.Name] != ph {
				if sb.Env == nil {
					sb.Env = map[string]string{}
				}
				sb.Env[r.Name], changed = ph, true
			}
		}
		refs = append(refs, r)
	}
	sb.Net.Secrets = refs
	return changed
}

// Effective is a lease as it stands at now: an active lease past its
// expiry counts as revoked (ReasonExpired); an active lease of a paused
// sandbox is frozen (ReasonPaused). Frozen is derived from the sandbox's
// state, never stored apart from it, so the two cannot disagree (a crash
// between a pause and its hook leaves no active lease on a paused
// sandbox), and a pause costs no store write.
func Effective(l store.Lease, now time.Time, paused bool) store.Lease {
	switch {
	case l.State == store.LeaseActive && !l.ExpiresAt.IsZero() && !now.Before(l.ExpiresAt):
		l.State, l.Reason, l.ChangedAt = store.LeaseRevoked, ReasonExpired, l.ExpiresAt
	case l.State == store.LeaseActive && paused:
		l.State, l.Reason = store.LeaseFrozen, ReasonPaused
	}
	return l
}

// Paused reports whether a sandbox in state st has its leases frozen: from
// the start of a pause until its resume has completed (a resume's boot
// registers them frozen; the resumed hook issues the next generation).
func Paused(st sandbox.State) bool {
	return st == sandbox.Pausing || st == sandbox.Paused || st == sandbox.Resuming
}

// Current maps each secret to the placeholder of its live (active or
// frozen) lease of the highest generation: what the sandbox's env holds.
func Current(ls []store.Lease, now time.Time) map[string]string {
	out := map[string]string{}
	gen := map[string]int{}
	for _, l := range ls {
		l = Effective(l, now, false)
		if l.State == store.LeaseRevoked {
			continue
		}
		if g, ok := gen[l.Secret]; !ok || l.Generation >= g {
			out[l.Secret], gen[l.Secret] = l.Placeholder, l.Generation
		}
	}
	return out
}

// EnvFile is /run/berth/leases.env: one NAME=PLACEHOLDER line per secret
// with a live lease, sorted, for running processes to re-read (`. FILE`).
// Names are env var names and placeholders [a-z0-9_-], so it is safe to source.
func EnvFile(current map[string]string) []byte {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(current)) {
		b.WriteString(k + "=" + current[k] + "\n")
	}
	return []byte(b.String())
}

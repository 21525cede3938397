// Package leases owns credential leases (issue 17, docs/LEASES.md): a
// secret granted to a sandbox is issued to one generation of it as a lease
// (id, generation, secret, scope = host + header, a fresh placeholder,
// expiry, state active | frozen | revoked). The egress proxy injects a
// secret only for the sandbox's active lease (egress.DecideGrants); the
// lifecycle's statehook moves the leases along the state table: pause
// freezes them, resume and rewind revoke them and issue the next
// generation, a fork's child and a sandbox created from a snapshot get
// leases of their own. Leases live in the store (store.LeaseStore), so a
// daemon restart keeps their states; the proxy's in-memory grants are
// rebuilt from them (ProxyLeases).
//
// Locks: mu (a leaf) serialises the plan and store write of one change so
// two never interleave; the only core call under it is WriteFiles (files
// only, never calls back). Hooks run under the sandbox's lock; Revoke takes
// it (Core.Lock) before mu.
package leases

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the service needs of the lifecycle core (daemon.leasesCore).
type Core interface {
	// Visible loads a sandbox as owner may see it ("" = admin).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Lock(id string) func()
	// Scope is the host and header name owner's secret is injected with
	// (NotFound once it is deleted).
	Scope(ctx context.Context, owner, secret string) (Scope, error)
	// WriteFiles tells sandbox sb its current placeholders (in its env, see
	// SetPlaceholders): env.json when env (new execs get them) and
	// /run/berth/leases.env (file, for running processes). It only writes
	// files (it never calls back), so it may run under mu, beside the
	// store write.
	WriteFiles(sb *sandbox.Sandbox, file []byte, env bool) error
	// Refresh re-registers sb's grants with the proxy from the store; with
	// freeze it only marks the proxy's active grants of sb frozen (a pause:
	// no store read on the way).
	Refresh(ctx context.Context, sb *sandbox.Sandbox, freeze bool) error
	// PrepareProxyLeases opens the secrets of ls (as ProxyLeases would
	// return them: a change's own result, with no lease read) and returns
	// set, which registers them as sb's grants with the proxy if sb is
	// attached by then.
	PrepareProxyLeases(ctx context.Context, sb *sandbox.Sandbox, ls []store.Lease) (set func() error, err error)
	Now() time.Time
}

// Auditor receives the lease service's audit entries (docs/STATE.md); nil: none.
type Auditor interface {
	Audit(ctx context.Context, actor, action, sandboxID string, data map[string]string)
}

// Config configures the service.
type Config struct {
	Log     *slog.Logger
	Auditor Auditor
	// KeepRevoked is how many revoked leases per sandbox the proxy still
	// knows (to log a stale placeholder as lease_revoked); default 16.
	KeepRevoked int
}

// Service is the credential-lease service.
type Service struct {
	core Core
	st   store.LeaseStore
	cfg  Config

	mu sync.Mutex
}

// New builds the service.
func New(core Core, st store.LeaseStore, cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepRevoked <= 0 {
		cfg.KeepRevoked = 16
	}
	return &Service{core: core, st: st, cfg: cfg}
}

// OnState applies the state table's credential row (statehook).
func (s *Service) OnState(ctx context.Context, ev statehook.Event) error {
	if ev.Sandbox == nil {
		return nil
	}
	switch ev.Phase {
	case statehook.Paused:
		// Frozen follows from the sandbox's state (Effective): only the
		// proxy is told (a freeze pause keeps the network attached).
		return s.core.Refresh(ctx, ev.Sandbox, true)
	case statehook.Resumed:
		if ev.LeasesReissued {
			return nil // in the resume's commit (Reissue)
		}
		return s.apply(ctx, ev.Sandbox, OpReissue, ReasonResumed, ev.Actor, true)
	case statehook.Forked:
		return s.apply(ctx, ev.Sandbox, OpEnsure, "", ev.Actor, true)
	case statehook.Restored:
		if ev.From == ev.Sandbox.ID { // rewound in place: old placeholders are in its memory image
			return s.apply(ctx, ev.Sandbox, OpReissue, ReasonRestored, ev.Actor, true)
		}
		return s.apply(ctx, ev.Sandbox, OpEnsure, "", ev.Actor, true)
	}
	return nil
}

// ProxyLeases returns the leases of sb the egress proxy registers: its live
// ones and its newest revoked ones (so a stale placeholder is logged as
// such). Secrets granted to sb without a lease yet get one first (create,
// a fork's boot, a sandbox that predates leases). hostnet calls it whenever
// it registers sb's grants.
func (s *Service) ProxyLeases(ctx context.Context, sb *sandbox.Sandbox) ([]store.Lease, error) {
	if len(sb.Net.Secrets) > 0 {
		if err := s.apply(ctx, sb, OpEnsure, "", "berth", false); err != nil {
			return nil, err
		}
	}
	ls, err := s.st.ListLeases(ctx, store.LeaseFilter{SandboxID: sb.ID})
	if err != nil {
		return nil, err
	}
	return s.proxyList(ls, sb), nil
}

// proxyList is what ProxyLeases returns of sb's leases ls.
func (s *Service) proxyList(ls []store.Lease, sb *sandbox.Sandbox) []store.Lease {
	now := s.core.Now()
	var live, revoked []store.Lease
	for _, l := range ls {
		if l = Effective(l, now, Paused(sb.State)); l.State == store.LeaseRevoked {
			revoked = append(revoked, l)
		} else {
			live = append(live, l)
		}
	}
	if n := len(revoked); n > s.cfg.KeepRevoked {
		revoked = revoked[n-s.cfg.KeepRevoked:]
	}
	return append(live, revoked...)
}

// apply plans op on sb's leases, stores the change (with the sandbox's env
// and grants, in one transaction) and publishes the sandbox's placeholders
// (and the proxy's grants when refresh).
func (s *Service) apply(ctx context.Context, sb *sandbox.Sandbox, op Op, reason, actor string, refresh bool) (err error) {
	ph := phases.Start("lease " + string(op))
	defer func() { ph.Log(ctx, s.cfg.Log, sb.ID, err) }()
	ch, ls, after, err := s.plan(ctx, sb, op, reason, ph)
	if err != nil || ch.Empty() {
		return err
	}
	s.auditChange(ctx, actor, sb.ID, ch)
	ph.Mark("audits")
	if !refresh {
		return nil
	}
	if after == nil {
		after = sb // the sandbox's row did not change
	}
	// The leases just written, not read again (nor ensured: every granted
	// secret with a scope has one now).
	err = s.setProxyLeases(ctx, after, s.proxyList(ls, after))
	ph.Mark("refresh")
	return err
}

func (s *Service) setProxyLeases(ctx context.Context, sb *sandbox.Sandbox, ls []store.Lease) error {
	set, err := s.core.PrepareProxyLeases(ctx, sb, ls)
	if err != nil {
		return err
	}
	return set()
}

func (s *Service) auditChange(ctx context.Context, actor, sandboxID string, ch Change) {
	for _, l := range ch.Issue {
		s.audit(ctx, actor, "lease.issue", l, ReasonIssued)
	}
	for _, u := range ch.Set {
		if u.State == store.LeaseRevoked {
			s.audit(ctx, actor, "lease.revoke", store.Lease{ID: u.ID, SandboxID: sandboxID}, u.Reason)
		}
	}
}

// plan computes and stores op's change; it returns the change, the
// sandbox's leases after it and its stored row if the change rewrote it
// (nil: unchanged).
func (s *Service) plan(ctx context.Context, sb *sandbox.Sandbox, op Op, reason string, ph *phases.Timer) (Change, []store.Lease, *sandbox.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls, ch, err := s.read(ctx, sb, op, reason, ph)
	if err != nil || ch.Empty() {
		return ch, nil, nil, err
	}
	all := After(ls, ch)
	cur := Current(all, s.core.Now())
	// The files are written beside the store write (a resume waits for
	// both): if the write fails, the files name placeholders of no lease,
	// which the proxy refuses (fail closed), and the hook's error says so.
	predicted, envChanged := predict(sb, cur)
	var fileErr error
	var fileTime time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.Now()
		fileErr = s.core.WriteFiles(predicted, EnvFile(cur), envChanged)
		fileTime = time.Since(t)
	})
	var after *sandbox.Sandbox
	err = s.st.ApplyLeases(ctx, sb.ID, ch.Set, ch.Issue, func(x *sandbox.Sandbox) bool {
		after = nil
		if SetPlaceholders(x, cur, "") {
			after = x
		}
		return after != nil
	})
	ph.Mark("commit")
	wg.Wait()
	ph.Add("files", fileTime)
	if err = errors.Join(err, fileErr); err != nil {
		return Change{}, nil, nil, err
	}
	return ch, all, after, nil
}

// predict is sb as it will be stored with placeholders cur, and whether
// its env changes.
func predict(sb *sandbox.Sandbox, cur map[string]string) (*sandbox.Sandbox, bool) {
	p := *sb
	p.Env, p.Net.Secrets = maps.Clone(sb.Env), slices.Clone(sb.Net.Secrets)
	changed := SetPlaceholders(&p, cur, "")
	return &p, changed
}

// read plans op on sb's leases (store reads only): sb's leases as read and
// the change.
func (s *Service) read(ctx context.Context, sb *sandbox.Sandbox, op Op, reason string, ph *phases.Timer) ([]store.Lease, Change, error) {
	ls, err := s.st.ListLeases(ctx, store.LeaseFilter{SandboxID: sb.ID})
	if err != nil {
		return nil, Change{}, err
	}
	ph.Mark("list")
	has := map[string]bool{}
	for _, l := range ls {
		has[l.Secret] = true
	}
	scopes := map[string]Scope{}
	for _, ref := range sb.Net.Secrets {
		if op == OpEnsure && has[ref.Name] {
			continue // nothing to issue: no need to look the secret up
		}
		sc, err := s.core.Scope(ctx, sb.Owner, ref.Name)
		if errs.Is(err, errs.NotFound) {
			continue // deleted: its placeholder reaches the server unreplaced
		}
		if err != nil {
			return nil, Change{}, err
		}
		scopes[ref.Name] = sc
	}
	ph.Mark("scopes")
	ch := Plan(op, Input{
		Sandbox: sb.ID, Owner: sb.Owner, Refs: sb.Net.Secrets, Leases: ls, Scopes: scopes, TTL: sb.Net.LeaseTTL, Now: s.core.Now(), Reason: reason,
		NewID: newLeaseID, NewPlaceholder: egress.NewPlaceholder,
		Taken: func(ph string) bool {
			other, err := s.st.ListLeases(ctx, store.LeaseFilter{Placeholder: ph})
			return err != nil || len(other) > 0
		},
	})
	ph.Mark("plan")
	return ls, ch, nil
}

// List returns a sandbox's leases as owner may see them ("" = admin), as
// they stand now (an expired lease shows as revoked), oldest first.
func (s *Service) List(ctx context.Context, owner, sandboxID string) ([]store.Lease, error) {
	sb, err := s.core.Visible(ctx, owner, sandboxID)
	if err != nil {
		return nil, err
	}
	ls, err := s.st.ListLeases(ctx, store.LeaseFilter{SandboxID: sb.ID})
	if err != nil {
		return nil, err
	}
	return s.effective(ctx, ls, map[string]*sandbox.Sandbox{sb.ID: sb}), nil
}

// ListAll returns every lease of owner ("" = every owner's).
func (s *Service) ListAll(ctx context.Context, owner string) ([]store.Lease, error) {
	ls, err := s.st.ListLeases(ctx, store.LeaseFilter{Owner: owner})
	if err != nil {
		return nil, err
	}
	return s.effective(ctx, ls, map[string]*sandbox.Sandbox{}), nil
}

// effective is ls as it stands now, by sandbox (sbs caches their rows).
func (s *Service) effective(ctx context.Context, ls []store.Lease, sbs map[string]*sandbox.Sandbox) []store.Lease {
	now := s.core.Now()
	for i := range ls {
		sb, ok := sbs[ls[i].SandboxID]
		if !ok {
			sb, _ = s.core.Visible(ctx, "", ls[i].SandboxID)
			sbs[ls[i].SandboxID] = sb
		}
		ls[i] = Effective(ls[i], now, sb != nil && Paused(sb.State))
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].SandboxID < ls[j].SandboxID })
	return ls
}

// Revoke revokes a lease at once, as owner ("" = admin): the proxy stops
// injecting it from the next request, and the secret's grant is withdrawn
// from the sandbox (not issued again on resume, nor to later forks). A
// lease owner may not see is NotFound.
func (s *Service) Revoke(ctx context.Context, owner, actor, id string) (store.Lease, error) {
	l, err := s.st.GetLease(ctx, id)
	if err != nil {
		return store.Lease{}, err
	}
	if owner != "" && l.Owner != owner {
		return store.Lease{}, errs.E(errs.NotFound, "lease %s not found", id)
	}
	unlock := s.core.Lock(l.SandboxID)
	defer unlock()
	if l, err = s.st.GetLease(ctx, id); err != nil {
		return store.Lease{}, err
	}
	if l.State == store.LeaseRevoked {
		return l, nil
	}
	now := s.core.Now()
	s.mu.Lock()
	set := []store.LeaseUpdate{{ID: id, State: store.LeaseRevoked, Reason: ReasonRevoked, At: now}}
	var cur map[string]string
	var after *sandbox.Sandbox
	ls, err := s.st.ListLeases(ctx, store.LeaseFilter{SandboxID: l.SandboxID})
	if err == nil {
		cur = Current(After(ls, Change{Set: set}), now)
		// The grant is withdrawn with it: not issued again on resume, nor
		// to later forks.
		err = s.st.ApplyLeases(ctx, l.SandboxID, set, nil, func(x *sandbox.Sandbox) bool {
			after = x
			return SetPlaceholders(x, cur, l.Secret)
		})
	}
	s.mu.Unlock()
	if err != nil {
		return store.Lease{}, err
	}
	s.audit(ctx, actor, "lease.revoke", l, ReasonRevoked)
	if err := errors.Join(s.core.WriteFiles(after, EnvFile(cur), false), s.core.Refresh(ctx, after, false)); err != nil {
		return store.Lease{}, err
	}
	return s.st.GetLease(ctx, id)
}

func (s *Service) audit(ctx context.Context, actor, action string, l store.Lease, reason string) {
	if s.cfg.Auditor == nil {
		return
	}
	if actor == "" {
		actor = "berth"
	}
	data := map[string]string{"lease": l.ID, "reason": reason}
	if l.Secret != "" {
		data["secret"], data["generation"], data["host"] = l.Secret, strconv.Itoa(l.Generation), l.Host
	}
	s.cfg.Auditor.Audit(ctx, actor, action, l.SandboxID, data)
}

func newLeaseID() string { return "l" + sandbox.NewID()[1:] }

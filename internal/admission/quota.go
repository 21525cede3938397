package admission

import (
	"context"
	"sync"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Admit validates a new sandbox's idle policy, checks its owner's quota and
// writes the creating intent, all under one lock: two concurrent creates
// can never both fit under a limit that has room for one, and a refused
// create leaves nothing behind (no row, no event, no directory).
func (a *Service) Admit(ctx context.Context, sb *sandbox.Sandbox) error {
	if p := sb.IdlePolicy; p != "" {
		if err := a.cfg.Reaper.CheckName("idle_policy", p); err != nil {
			return err
		}
	}
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	if err := a.checkQuotaLocked(ctx, sb.Owner, sb.Resources); err != nil {
		return err
	}
	return a.core.Store().CreateSandbox(ctx, sb)
}

// AdmitClaim checks a create's quota before a warm pool claim and holds the
// admission lock until release, so the claim (an ownership transfer in one
// store write) cannot race other creates past a limit. On a pool miss the
// caller releases and admit checks again as usual.
func (a *Service) AdmitClaim(ctx context.Context, owner string, r sandbox.Resources, idlePolicy string) (release func(), err error) {
	if p := idlePolicy; p != "" {
		if err := a.cfg.Reaper.CheckName("idle_policy", p); err != nil {
			return nil, err
		}
	}
	a.admitMu.Lock()
	if err := a.checkQuotaLocked(ctx, owner, r); err != nil {
		a.admitMu.Unlock()
		return nil, err
	}
	return a.admitMu.Unlock, nil
}

// checkQuotaLocked runs quota.Check for one more sandbox; admitMu is held.
// Starts in progress (ReserveStart) count as running.
func (a *Service) checkQuotaLocked(ctx context.Context, owner string, r sandbox.Resources) error {
	lim, _, err := a.limitsOf(ctx, owner)
	if err != nil || lim == (quota.Limits{}) {
		return err
	}
	use, err := a.useOf(ctx, owner)
	if err != nil {
		return err
	}
	if p, ok := a.startsPending[owner]; ok {
		use.Sandboxes += p.n
		use.CPU += float64(p.cpuMillis) / 1000
		use.MemoryMiB += p.memoryMiB
	}
	if err := quota.Check(owner, lim, use, r); err != nil {
		a.observeRejection(errs.FieldOf(err))
		return err
	}
	return nil
}

// limitsOf returns owner's effective limits and where they come from:
// "stored" (admin API), "config" or "none".
func (a *Service) limitsOf(ctx context.Context, owner string) (quota.Limits, string, error) {
	l, err := a.core.Store().GetQuota(ctx, owner)
	switch {
	case err == nil:
		return l, "stored", nil
	case !errs.Is(err, errs.NotFound):
		return quota.Limits{}, "", err
	}
	l = a.cfg.Quotas.For(owner)
	if l == (quota.Limits{}) {
		return l, "none", nil
	}
	return l, "config", nil
}

// useOf tallies what owner holds now.
func (a *Service) useOf(ctx context.Context, owner string) (quota.Use, error) {
	list, _, err := a.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: owner})
	if err != nil {
		return quota.Use{}, err
	}
	u := quota.Tally(list)
	snaps, err := a.core.Store().ListSnapshots(ctx, owner)
	if err != nil {
		return quota.Use{}, err
	}
	u.Snapshots = len(snaps)
	return u, nil
}

// QuotaInfo is one owner's limits and current use.
type QuotaInfo struct {
	Owner  string       `json:"owner"`
	Source string       `json:"source"` // stored | config | none
	Limits quota.Limits `json:"limits"`
	Use    quota.Use    `json:"use"`
}

// Quota reports owner's limits and use.
func (a *Service) Quota(ctx context.Context, owner string) (QuotaInfo, error) {
	if err := auth.ValidOwner("owner", owner); err != nil {
		return QuotaInfo{}, err
	}
	l, src, err := a.limitsOf(ctx, owner)
	if err != nil {
		return QuotaInfo{}, err
	}
	u, err := a.useOf(ctx, owner)
	if err != nil {
		return QuotaInfo{}, err
	}
	return QuotaInfo{Owner: owner, Source: src, Limits: l, Use: u}, nil
}

// Quotas lists every owner with stored or configured limits.
func (a *Service) Quotas(ctx context.Context) ([]QuotaInfo, error) {
	stored, err := a.core.Store().ListQuotas(ctx)
	if err != nil {
		return nil, err
	}
	owners := map[string]bool{}
	for o := range stored {
		owners[o] = true
	}
	for o := range a.cfg.Quotas.Owners {
		owners[o] = true
	}
	out := []QuotaInfo{}
	for _, o := range sortedKeys(owners) {
		qi, err := a.Quota(ctx, o)
		if err != nil {
			return nil, err
		}
		out = append(out, qi)
	}
	return out, nil
}

// SetQuota stores owner's limits (admin). Existing sandboxes are never
// evicted by a lower limit; it only refuses new ones.
func (a *Service) SetQuota(ctx context.Context, owner string, l quota.Limits) (QuotaInfo, error) {
	if err := auth.ValidOwner("owner", owner); err != nil {
		return QuotaInfo{}, err
	}
	if err := l.Validate(""); err != nil {
		return QuotaInfo{}, err
	}
	if err := a.core.Store().PutQuota(ctx, owner, l); err != nil {
		return QuotaInfo{}, err
	}
	return a.Quota(ctx, owner)
}

// DeleteQuota removes owner's stored limits; configured ones apply again.
func (a *Service) DeleteQuota(ctx context.Context, owner string) error {
	return a.core.Store().DeleteQuota(ctx, owner)
}

// pendingStarts sums the starts of one owner that are admitted but not yet
// running.
type pendingStarts struct {
	n, cpuMillis int
	memoryMiB    int64
}

// ReserveStart admits a stopped or failed sandbox going back to running: it
// holds no CPU or memory while stopped (its disk is counted all along), so
// `berth start` must fit the owner's sandbox, CPU and memory limits like a
// create. The reservation counts until release, which the caller runs once
// the sandbox's state says running (or the start failed).
func (a *Service) ReserveStart(ctx context.Context, sb *sandbox.Sandbox) (release func(), err error) {
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	r := sb.Resources
	r.DiskMiB = 0 // already counted: a stopped sandbox keeps its disk
	if err := a.checkQuotaLocked(ctx, sb.Owner, r); err != nil {
		return nil, err
	}
	p := a.startsPending[sb.Owner]
	p.n++
	p.cpuMillis += r.CPUMillis
	p.memoryMiB += r.MemoryMiB
	a.startsPending[sb.Owner] = p
	var once sync.Once
	return func() {
		once.Do(func() {
			a.admitMu.Lock()
			defer a.admitMu.Unlock()
			p := a.startsPending[sb.Owner]
			if p.n--; p.n <= 0 {
				delete(a.startsPending, sb.Owner)
				return
			}
			p.cpuMillis -= r.CPUMillis
			p.memoryMiB -= r.MemoryMiB
			a.startsPending[sb.Owner] = p
		})
	}, nil
}

// CheckAdmit says whether owner could have one more sandbox of size r now
// (a fork asks before it takes a snapshot for children that could not run).
func (a *Service) CheckAdmit(ctx context.Context, owner string, r sandbox.Resources) error {
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	return a.checkQuotaLocked(ctx, owner, r)
}

// ReserveSnapshot checks owner's snapshot limit counting stored snapshots,
// checkpoints (internal/timeline) and captures in progress, and reserves one until release: a capture takes
// seconds, so it is counted rather than run under the admission lock.
func (a *Service) ReserveSnapshot(ctx context.Context, owner string) (release func(), err error) {
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	l, _, err := a.limitsOf(ctx, owner)
	if err != nil {
		return nil, err
	}
	if l.Snapshots > 0 {
		list, err := a.core.Store().ListSnapshots(ctx, owner)
		if err != nil {
			return nil, err
		}
		cks, err := a.core.Store().CountCheckpoints(ctx, owner) // checkpoints on timelines count too
		if err != nil {
			return nil, err
		}
		if err := quota.CheckSnapshot(owner, l, quota.Use{Snapshots: len(list) + cks + a.snapshotsPending[owner]}); err != nil {
			a.observeRejection("snapshots")
			return nil, err
		}
	}
	a.snapshotsPending[owner]++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.admitMu.Lock()
			if a.snapshotsPending[owner]--; a.snapshotsPending[owner] <= 0 {
				delete(a.snapshotsPending, owner)
			}
			a.admitMu.Unlock()
		})
	}, nil
}

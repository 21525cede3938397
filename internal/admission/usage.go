package admission

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/pool"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// UsageLine is one sandbox's (or one owner's) metered usage with its cost
// on both bases.
type UsageLine struct {
	SandboxID string            `json:"sandbox_id,omitempty"`
	Owner     string            `json:"owner"`
	Template  string            `json:"template,omitempty"`
	State     sandbox.State     `json:"state,omitempty"`
	Reserved  sandbox.Resources `json:"reserved,omitzero"`
	Sandboxes int               `json:"sandboxes,omitempty"` // owner lines

	CPUSeconds     float64   `json:"cpu_seconds"`
	MemGiBSeconds  float64   `json:"memory_gib_seconds"`
	MemAvgMiB      float64   `json:"memory_avg_mib"`
	MemPeakMiB     float64   `json:"memory_peak_mib"`
	RunningSeconds float64   `json:"running_seconds"`
	FrozenSeconds  float64   `json:"frozen_seconds"`
	PausedSeconds  float64   `json:"paused_seconds"`
	StoppedSeconds float64   `json:"stopped_seconds"`
	DiskGiBHours   float64   `json:"disk_gib_hours"`
	CostReserved   float64   `json:"cost_reserved"`
	CostActive     float64   `json:"cost_active"`
	LastActiveAt   time.Time `json:"last_active_at,omitzero"`
}

// UsageReport is the body of GET /v1/usage.
type UsageReport struct {
	Since     time.Time       `json:"since,omitzero"`
	Prices    metering.Prices `json:"prices"`
	Owners    []UsageLine     `json:"owners"`
	Sandboxes []UsageLine     `json:"sandboxes"`
}

func line(u metering.Usage, p metering.Prices) UsageLine {
	c := metering.Price(u, p)
	return UsageLine{SandboxID: u.SandboxID, Owner: u.Owner, Template: u.Template, State: u.State, Reserved: u.Reserved,
		CPUSeconds: u.CPUSeconds, MemGiBSeconds: u.MemGiBSeconds, MemAvgMiB: u.MemAvgBytes() / (1 << 20),
		MemPeakMiB: float64(u.MemPeakBytes) / (1 << 20), RunningSeconds: u.RunningSeconds, FrozenSeconds: u.FrozenSeconds,
		PausedSeconds: u.PausedSeconds, StoppedSeconds: u.StoppedSeconds, DiskGiBHours: u.DiskGiBHours,
		CostReserved: c.Reserved, CostActive: c.Active, LastActiveAt: u.LastActiveAt}
}

// Usage reports metered usage of owner ("" = every owner, admin) since a time.
func (a *Service) Usage(ctx context.Context, owner string, since time.Time, sandboxID string) (UsageReport, error) {
	if owner != "" {
		if err := auth.ValidOwner("owner", owner); err != nil {
			return UsageReport{}, err
		}
	}
	list, err := a.core.Store().ListUsage(ctx, store.UsageFilter{Owner: owner, Since: since, SandboxID: sandboxID})
	if err != nil {
		return UsageReport{}, err
	}
	rep := UsageReport{Since: since, Prices: a.cfg.Prices, Owners: []UsageLine{}, Sandboxes: []UsageLine{}}
	byOwner := map[string]UsageLine{}
	for _, u := range list {
		l := line(u, a.cfg.Prices)
		rep.Sandboxes = append(rep.Sandboxes, l)
		o := byOwner[u.Owner]
		o.Owner = u.Owner
		o.Sandboxes++
		o.CPUSeconds += l.CPUSeconds
		o.MemGiBSeconds += l.MemGiBSeconds
		o.MemPeakMiB = max(o.MemPeakMiB, l.MemPeakMiB)
		o.RunningSeconds += l.RunningSeconds
		o.FrozenSeconds += l.FrozenSeconds
		o.PausedSeconds += l.PausedSeconds
		o.StoppedSeconds += l.StoppedSeconds
		o.DiskGiBHours += l.DiskGiBHours
		o.CostReserved += l.CostReserved
		o.CostActive += l.CostActive
		o.LastActiveAt = later(o.LastActiveAt, l.LastActiveAt)
		byOwner[u.Owner] = o
	}
	for _, o := range sortedKeys(byOwner) {
		l := byOwner[o]
		if t := l.RunningSeconds + l.FrozenSeconds; t > 0 {
			l.MemAvgMiB = l.MemGiBSeconds / t * 1024
		}
		rep.Owners = append(rep.Owners, l)
	}
	return rep, nil
}

// Orphan is one thing nobody touched for the report's window.
type Orphan struct {
	Kind         string    `json:"kind"` // sandbox, snapshot or template
	ID           string    `json:"id"`
	Owner        string    `json:"owner,omitempty"`
	State        string    `json:"state"`
	Template     string    `json:"template,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	LastActiveAt time.Time `json:"last_active_at,omitzero"`
	AgeDays      float64   `json:"age_days"`
	IdleDays     float64   `json:"idle_days"`
	CostReserved float64   `json:"cost_reserved"`
	CostActive   float64   `json:"cost_active"`
	// What it costs per day from now on the reserved basis (its current
	// state's bucket, metering.ReservedPerDay) and on the active basis
	// (paused or stopped: its disk; running or frozen: its last 24 hours'
	// rate; metering.ActivePerDay).
	CostPerDayReserved float64           `json:"cost_per_day_reserved"`
	CostPerDayActive   float64           `json:"cost_per_day_active"`
	Reserved           sandbox.Resources `json:"reserved,omitzero"`
}

// OrphanReport is the body of GET /v1/reports/orphans.
type OrphanReport struct {
	Days  int      `json:"days"`
	Items []Orphan `json:"items"`
}

// Orphans lists sandboxes (of owner; "" = all) and, for the admin, templates
// nobody touched for days: no API call, client, write or CPU for sandboxes;
// no sandbox started from a template.
func (a *Service) Orphans(ctx context.Context, owner string, admin bool, days int) (OrphanReport, error) {
	if days < 0 || days > 3650 {
		return OrphanReport{}, errs.Field("days", "must be between 0 and 3650")
	}
	now := a.core.Now()
	cutoff := now.Add(-time.Duration(days) * 24 * time.Hour)
	rep := OrphanReport{Days: days, Items: []Orphan{}}
	list, _, err := a.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: owner})
	if err != nil {
		return rep, err
	}
	usage, err := a.core.Store().ListUsage(ctx, store.UsageFilter{Owner: owner})
	if err != nil {
		return rep, err
	}
	byID := map[string]metering.Usage{}
	for _, u := range usage {
		byID[u.SandboxID] = u
	}
	recent, err := a.core.Store().ListUsage(ctx, store.UsageFilter{Owner: owner, Since: now.Add(-24 * time.Hour)})
	if err != nil {
		return rep, err
	}
	lastDay := map[string]metering.Usage{}
	for _, u := range recent {
		lastDay[u.SandboxID] = u
	}
	lastUse := map[string]time.Time{} // template → latest sandbox creation or activity
	for _, sb := range list {
		u := byID[sb.ID]
		active := later(sb.CreatedAt, u.LastActiveAt)
		lastUse[sb.Template] = later(lastUse[sb.Template], active)
		// Warm pool members wait to be claimed, they are not abandoned
		// (the reaper exempts them too); a clean-up must not race a claim.
		if sb.State == sandbox.Deleted || active.After(cutoff) || pool.IsMember(sb) {
			continue
		}
		u.Reserved = sb.Resources
		c := metering.Price(u, a.cfg.Prices)
		day := lastDay[sb.ID]
		day.Reserved = sb.Resources
		bucket := metering.BucketOf(sb.State, sb.PauseActual)
		rep.Items = append(rep.Items, Orphan{Kind: "sandbox", ID: sb.ID, Owner: sb.Owner, State: string(sb.State),
			Template: sb.Template, CreatedAt: sb.CreatedAt, LastActiveAt: u.LastActiveAt,
			AgeDays: days2(now.Sub(sb.CreatedAt)), IdleDays: days2(now.Sub(active)),
			CostReserved: c.Reserved, CostActive: c.Active, Reserved: sb.Resources,
			CostPerDayReserved: metering.ReservedPerDay(bucket, sb.Resources, a.cfg.Prices),
			CostPerDayActive:   metering.ActivePerDay(bucket, day, u.DiskBytes, a.cfg.Prices)})
	}
	snaps, err := a.core.Store().ListSnapshots(ctx, owner)
	if err != nil {
		return rep, err
	}
	snapUse := map[string]time.Time{} // snapshot → latest activity of a sandbox started from it
	for _, sb := range list {
		if id := sb.Lineage.Snapshot; id != "" {
			snapUse[id] = later(snapUse[id], later(sb.CreatedAt, byID[sb.ID].LastActiveAt))
		}
	}
	for _, sn := range snaps {
		active := later(sn.CreatedAt, snapUse[sn.ID])
		if active.After(cutoff) {
			continue
		}
		state := "disk"
		if sn.MemoryPath != "" {
			state = "disk+memory"
		}
		rep.Items = append(rep.Items, Orphan{Kind: "snapshot", ID: sn.ID, Owner: sn.Owner, State: state,
			Template: sn.Template, CreatedAt: sn.CreatedAt, LastActiveAt: snapUse[sn.ID],
			AgeDays: days2(now.Sub(sn.CreatedAt)), IdleDays: days2(now.Sub(active))})
	}
	if admin && owner == "" {
		tpls, err := a.core.Store().ListTemplates(ctx)
		if err != nil {
			return rep, err
		}
		for _, t := range tpls {
			active := later(t.UpdatedAt, lastUse[t.Name])
			if active.After(cutoff) {
				continue
			}
			rep.Items = append(rep.Items, Orphan{Kind: "template", ID: t.Name, State: t.State, CreatedAt: t.CreatedAt,
				LastActiveAt: lastUse[t.Name], AgeDays: days2(now.Sub(t.CreatedAt)), IdleDays: days2(now.Sub(active))})
		}
	}
	return rep, nil
}

func days2(d time.Duration) float64 { return float64(int(d.Hours()/24*100)) / 100 }

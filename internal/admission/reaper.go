package admission

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// tracked is the reaper loop's per-sandbox memory: the metering cursor and
// the signals that persist across daemon restarts (in the usage row).
type tracked struct {
	usage metering.Usage
	sig   persistedSignals
	since time.Time // floor for every "last busy" time (reaper.Sandbox.Since)
	cpu   float64   // latest CPU use, fraction of the effective allocation
	// agentStreams is the agent's count of open exec/attach/watch streams
	// (covers the E2B surface, whose streams go straight to the agent).
	agentStreams int
}

// persistedSignals is the JSON stored in usage.signals.
type persistedSignals struct {
	State       sandbox.State `json:"state,omitempty"`
	LastClient  time.Time     `json:"client,omitzero"`
	LastAPI     time.Time     `json:"api,omitzero"`
	LastWrite   time.Time     `json:"write,omitzero"`
	LastEgress  time.Time     `json:"egress,omitzero"`
	LastCPU     time.Time     `json:"cpu,omitzero"`
	SpinSince   time.Time     `json:"spin,omitzero"`
	ThrottledAt time.Time     `json:"throttled,omitzero"`
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (p persistedSignals) lastActive() time.Time {
	t := p.LastClient
	for _, x := range []time.Time{p.LastAPI, p.LastWrite, p.LastEgress, p.LastCPU} {
		t = later(t, x)
	}
	return t
}

// ReaperCore is what the reaper loop needs of the lifecycle core besides
// Core: events, the agent's activity, and the actions it takes.
type ReaperCore interface {
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	// Activity asks a running sandbox's agent for its activity.
	Activity(ctx context.Context, id string) (agentapi.Activity, error)
	// Exempt reports sandboxes the reaper leaves alone (warm pool members,
	// idle by design until claimed).
	Exempt(sb *sandbox.Sandbox) bool
	// LeaseUntil is the end of sb's active lease, or the zero time.
	LeaseUntil(sb *sandbox.Sandbox) time.Time
	// Pause pauses sb in mode ("" = the sandbox's default mode).
	Pause(ctx context.Context, sb *sandbox.Sandbox, mode sandbox.PauseMode, reason string) error
	// DemoteToDisk turns a memory or freeze pause into a disk pause.
	DemoteToDisk(ctx context.Context, id, reason string) error
	Stop(ctx context.Context, id, reason string) error
	Delete(ctx context.Context, id, reason string) error
}

// Reaper is the loop around reaper.Decide: every interval it samples each
// sandbox (cgroup accounting and disk for metering, activity for the
// reaper), persists usage and signals, and applies the decision. Its state
// is used by one goroutine only (Run, or a test calling Round).
type Reaper struct {
	a     *Service
	core  ReaperCore
	state map[string]*tracked
	cpu   *cpuMeter // the round in progress's CPU by phase (nil outside Round)
}

// NewReaper builds the reaper loop over this service's signals.
func (a *Service) NewReaper(core ReaperCore) *Reaper {
	return &Reaper{a: a, core: core, state: map[string]*tracked{}}
}

// Run loads the persisted signals, then runs a round every interval until
// ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	if err := r.Load(ctx); err != nil {
		r.a.core.Log().Error("reaper: load persisted signals", "err", err)
	}
	t := time.NewTicker(r.a.cfg.Reaper.Interval.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.Round(ctx)
	}
}

// Load re-derives the loop's memory after a restart from the usage
// rows: signals as they were at the last round before the daemon stopped.
func (r *Reaper) Load(ctx context.Context) error {
	state := r.state
	list, err := r.a.core.Store().ListUsage(ctx, store.UsageFilter{})
	if err != nil {
		return err
	}
	for _, u := range list {
		if u.State == sandbox.Deleted {
			continue
		}
		// Idleness is re-derived from the persisted signals, but floored at
		// this start: nobody could reach the sandbox while the daemon was down.
		tr := &tracked{usage: u, since: later(u.CreatedAt, r.a.started)}
		if u.Signals != "" {
			_ = json.Unmarshal([]byte(u.Signals), &tr.sig)
		}
		// Hour buckets are summed per query; the in-memory row only keeps the cursor.
		tr.usage.CPUSeconds, tr.usage.MemGiBSeconds, tr.usage.DiskGiBHours = 0, 0, 0
		tr.usage.RunningSeconds, tr.usage.FrozenSeconds, tr.usage.PausedSeconds, tr.usage.StoppedSeconds = 0, 0, 0, 0
		state[u.SandboxID] = tr
	}
	return nil
}

// Round samples, meters and reaps every sandbox once, at the core's now.
func (r *Reaper) Round(ctx context.Context) {
	state := r.state
	now := r.a.core.Now()
	wall := time.Now()
	cpu := newCPUMeter()
	r.cpu = cpu
	defer func() { r.cpu = nil }()
	list, _, err := r.a.core.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		r.a.core.Log().Error("reaper: list sandboxes", "err", err)
		return
	}
	seen := map[string]bool{}
	var recs []store.UsageRecord
	for _, sb := range list {
		if sb.State == sandbox.Deleted {
			continue
		}
		seen[sb.ID] = true
		tr, ok := state[sb.ID]
		if !ok {
			// First sight: a new sandbox, or one from before metering existed
			// (then its idleness starts now, not at its creation).
			tr = &tracked{since: sb.CreatedAt}
			tr.since = later(sb.CreatedAt, r.a.started)
			tr.usage = metering.Usage{SandboxID: sb.ID, CreatedAt: sb.CreatedAt}
			state[sb.ID] = tr
		}
		rec := r.sampleOne(ctx, sb, tr, now)
		recs = append(recs, rec)
		cpu.charge(&cpu.meter)
		r.reapOne(ctx, sb, tr, now)
		cpu.charge(&cpu.reap)
	}
	for id, tr := range state {
		if seen[id] {
			continue
		}
		// Deleted since the last round: close its usage row.
		tr.usage.State = sandbox.Deleted
		recs = append(recs, store.UsageRecord{Usage: tr.usage})
		delete(state, id)
	}
	r.a.prune(func(id string) bool { return seen[id] })
	if len(recs) > 0 {
		if err := r.a.core.Store().RecordUsage(context.WithoutCancel(ctx), recs); err != nil {
			r.a.core.Log().Error("metering: record usage", "err", err)
		}
	}
	cpu.charge(&cpu.meter)
	r.a.observeRound(RoundStats{At: now, Sandboxes: len(seen), Wall: time.Since(wall), MeterCPU: cpu.meter, ReapCPU: cpu.reap})
}

// sampleOne takes one metering sample and refreshes the sandbox's signals.
func (r *Reaper) sampleOne(ctx context.Context, sb *sandbox.Sandbox, tr *tracked, now time.Time) store.UsageRecord {
	pol := r.policyOf(sb)
	s := metering.Sample{At: now, Bucket: metering.BucketOf(sb.State, sb.PauseActual), DiskBytes: r.a.DiskBytes(sb.ID)}
	hasCgroup := sb.State == sandbox.Running || (sb.State == sandbox.Paused && sb.PauseActual == sandbox.PauseFreeze)
	if rt, err := r.a.core.RuntimeFor(sb); err == nil && hasCgroup {
		if st, err := rt.Stats(ctx, sb.ID); err == nil {
			s.HasCgroup, s.CPUNanos, s.MemBytes, s.MemPeak = true, st.CPUUsageNanos, st.MemoryBytes, st.MemoryPeak
		}
	}
	prev := tr.usage
	// CPU use over the interval, as a fraction of the effective allocation.
	tr.cpu = 0
	if s.HasCgroup && !prev.LastSampleAt.IsZero() && now.After(prev.LastSampleAt) && s.CPUNanos >= prev.LastCPUNanos && prev.LastCPUNanos > 0 {
		cores := float64(sb.Resources.CPUMillis) / 1000
		if !tr.sig.ThrottledAt.IsZero() {
			cores = pol.ThrottleCPU
		}
		if cores > 0 {
			tr.cpu = float64(s.CPUNanos-prev.LastCPUNanos) / float64(now.Sub(prev.LastSampleAt).Nanoseconds()) / cores
		}
	}
	next := metering.Add(prev, s)
	inc := metering.Usage{
		CPUSeconds: next.CPUSeconds - prev.CPUSeconds, MemGiBSeconds: next.MemGiBSeconds - prev.MemGiBSeconds,
		MemPeakBytes:   max(s.MemPeak, s.MemBytes),
		RunningSeconds: next.RunningSeconds - prev.RunningSeconds, FrozenSeconds: next.FrozenSeconds - prev.FrozenSeconds,
		PausedSeconds: next.PausedSeconds - prev.PausedSeconds, StoppedSeconds: next.StoppedSeconds - prev.StoppedSeconds,
		DiskGiBHours: next.DiskGiBHours - prev.DiskGiBHours,
	}
	// The workspace's allocated blocks changed: something wrote to it.
	if !prev.LastSampleAt.IsZero() && s.DiskBytes != prev.DiskBytes && sb.State == sandbox.Running {
		tr.sig.LastWrite = now
	}
	if r.cpu != nil {
		r.cpu.charge(&r.cpu.meter)
	}
	r.refreshSignals(ctx, sb, tr, pol, now) // the agent's activity: the reaper's signal
	if r.cpu != nil {
		r.cpu.charge(&r.cpu.reap)
	}

	next.Owner, next.Template, next.State, next.Reserved = sb.Owner, sb.Template, sb.State, sb.Resources
	next.CreatedAt = sb.CreatedAt
	next.LastActiveAt = tr.sig.lastActive()
	if b, err := json.Marshal(tr.sig); err == nil {
		next.Signals = string(b)
	}
	tr.usage = next
	return store.UsageRecord{Usage: next, Hour: now, Inc: inc}
}

// refreshSignals folds live signals, agent activity and CPU into tr.sig.
func (r *Reaper) refreshSignals(ctx context.Context, sb *sandbox.Sandbox, tr *tracked, pol reaper.Policy, now time.Time) {
	sig := &tr.sig
	if sig.State != sb.State {
		// Started, resumed or created since the last round: that was somebody's doing.
		if sb.State == sandbox.Running && sig.State != "" {
			sig.LastAPI = later(sig.LastAPI, now)
		}
		if sb.State != sandbox.Running {
			// A boot resets the cgroup to the sandbox's own quota.
			sig.ThrottledAt, sig.SpinSince = time.Time{}, time.Time{}
		}
		sig.State = sb.State
	}
	live := r.a.Live(sb.ID)
	sig.LastAPI = later(sig.LastAPI, live.LastAPI)
	sig.LastClient = later(sig.LastClient, live.LastClient)
	sig.LastEgress = later(sig.LastEgress, live.LastEgress)
	if live.Streams > 0 {
		sig.LastClient = now
	}
	if live.Egress > 0 {
		sig.LastEgress = now
	}
	if sb.State == sandbox.Running {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		act, err := r.core.Activity(actx, sb.ID)
		cancel()
		tr.agentStreams = 0
		if err == nil {
			tr.agentStreams = act.OpenStreams
			if act.OpenStreams > 0 {
				sig.LastClient = now
			}
			sig.LastWrite = later(sig.LastWrite, act.LastFileWrite)
		}
		if tr.cpu >= pol.CPUThreshold {
			sig.LastCPU = now
		}
		if tr.cpu >= pol.SpinThreshold {
			if sig.SpinSince.IsZero() {
				sig.SpinSince = tr.usage.LastSampleAt
				if sig.SpinSince.IsZero() {
					sig.SpinSince = now
				}
			}
		} else {
			sig.SpinSince = time.Time{}
		}
	}
}

// signalsOf builds reaper.Signals for Decide.
func (r *Reaper) signalsOf(sb *sandbox.Sandbox, tr *tracked, now time.Time) reaper.Signals {
	live := r.a.Live(sb.ID)
	sig := tr.sig
	out := reaper.Signals{
		Clients: live.Streams + tr.agentStreams, LeaseUntil: r.core.LeaseUntil(sb), Egress: live.Egress,
		LastClient: sig.LastClient, LastAPI: sig.LastAPI, LastWrite: sig.LastWrite, LastEgress: sig.LastEgress,
		LastCPU: sig.LastCPU, CPU: tr.cpu, SpinSince: sig.SpinSince, ThrottledAt: sig.ThrottledAt,
	}
	return out
}

// policyOf resolves a sandbox's idle policy: its own, its template's, the server's.
func (r *Reaper) policyOf(sb *sandbox.Sandbox) reaper.Policy {
	return r.a.cfg.Reaper.Resolve(sb.IdlePolicy, sb.Template)
}

// reapOne decides and acts on one sandbox. Every action is an event
// carrying the signals that led to it.
func (r *Reaper) reapOne(ctx context.Context, sb *sandbox.Sandbox, tr *tracked, now time.Time) {
	if r.core.Exempt(sb) {
		return // warm pool members idle by design; the pool sizes itself
	}
	pol := r.policyOf(sb)
	sig := r.signalsOf(sb, tr, now)
	dec := reaper.Decide(now, reaper.Sandbox{State: sb.State, PauseActual: sb.PauseActual,
		ExpiryAction: sb.ExpiryAction, Since: tr.since}, sig, pol)
	if dec.Action == reaper.None {
		return
	}
	data := sig.Data(now)
	data["policy"], data["action"], data["idle_for"] = pol.Name, string(dec.Action), dec.IdleFor.Round(time.Millisecond).String()
	if dec.Mode != "" {
		data["mode"] = string(dec.Mode)
	}
	r.core.Event(ctx, sb, "reaper", "reaper", dec.Reason, "reaper: "+string(dec.Action), data)
	r.a.observeAction(string(dec.Action), dec.Reason)
	r.a.core.Log().Info("reaper action", "sandbox_id", sb.ID, "owner", sb.Owner, "action", dec.Action, "reason", dec.Reason, "policy", pol.Name)
	var err error
	switch dec.Action {
	case reaper.Pause:
		err = r.core.Pause(ctx, sb, dec.Mode, dec.Reason)
	case reaper.PauseDisk:
		err = r.core.DemoteToDisk(ctx, sb.ID, dec.Reason)
	case reaper.Stop:
		err = r.core.Stop(ctx, sb.ID, dec.Reason)
	case reaper.Delete:
		err = r.core.Delete(ctx, sb.ID, dec.Reason)
	case reaper.Throttle:
		tr.sig.ThrottledAt = now
		err = r.a.SetCPUQuota(sb.ID, int(pol.ThrottleCPU*1000))
	case reaper.Unthrottle:
		tr.sig.ThrottledAt, tr.sig.SpinSince = time.Time{}, time.Time{}
		err = r.a.SetCPUQuota(sb.ID, sb.Resources.CPUMillis)
	}
	if err != nil && !errs.Is(err, errs.NotFound) {
		r.a.core.Log().Warn("reaper action failed", "sandbox_id", sb.ID, "action", dec.Action, "err", err)
		r.core.Event(ctx, sb, "reaper", "reaper_failed", dec.Reason, errs.Short(err), map[string]string{"action": string(dec.Action)})
	}
}

// DiskBytes is what a sandbox holds on the host disk: the workspace image's
// allocated blocks plus memory images.
func (a *Service) DiskBytes(id string) uint64 {
	var n uint64
	if st, err := os.Stat(filepath.Join(a.core.SandboxDir(id), "disk.img")); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			n += uint64(sys.Blocks) * 512
		}
	}
	_ = filepath.WalkDir(a.memoryDir(id), func(_ string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				if sys, ok := info.Sys().(*syscall.Stat_t); ok {
					n += uint64(sys.Blocks) * 512
				}
			}
		}
		return nil
	})
	return n
}

// memoryDir is where a sandbox's memory images live (the daemon's memoryDir).
func (a *Service) memoryDir(id string) string { return filepath.Join(a.core.SandboxDir(id), "memory") }

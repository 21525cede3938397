package server

import (
	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/sandbox"
)

// The server answers in api/wire types, never in the domain model: these
// functions are the one place a sandbox, an event, a pool, a network or a
// usage record becomes its wire form. Lists are never null in JSON.
// wire_test.go checks that each conversion carries every field.

func sandboxView(sb *sandbox.Sandbox) wire.Sandbox {
	return wire.Sandbox{
		ID: sb.ID, Owner: sb.Owner, Template: sb.Template, TemplateID: sb.TemplateID, Runtime: sb.Runtime,
		State: wire.State(sb.State), Reason: sb.Reason, Message: sb.Message, Labels: sb.Labels, Env: sb.Env,
		Resources: wire.Resources(sb.Resources), CreatedAt: sb.CreatedAt, StartedAt: sb.StartedAt,
		ExpiresAt: sb.ExpiresAt, ExpiryAction: wire.ExpiryAction(sb.ExpiryAction),
		PauseRequested: wire.PauseMode(sb.PauseRequested), PauseActual: wire.PauseMode(sb.PauseActual),
		ResumedFrom: wire.PauseMode(sb.ResumedFrom), RestoreCount: sb.RestoreCount, AutoResume: sb.AutoResume,
		Extra: sb.LegacyExtra(),
	}
}

func sandboxViews(list []*sandbox.Sandbox) []wire.Sandbox {
	out := make([]wire.Sandbox, 0, len(list))
	for _, sb := range list {
		out = append(out, sandboxView(sb))
	}
	return out
}

func eventViews(list []sandbox.Event) []wire.Event {
	out := make([]wire.Event, 0, len(list))
	for _, e := range list {
		out = append(out, wire.Event{Seq: e.Seq, SandboxID: e.SandboxID, Owner: e.Owner, Time: e.Time, Actor: e.Actor,
			Type: e.Type, From: wire.State(e.From), To: wire.State(e.To), Reason: e.Reason, Message: e.Message, Data: e.Data})
	}
	return out
}

func ttySize(t *wire.TTYSize) *agentapi.TTYSize {
	if t == nil {
		return nil
	}
	return &agentapi.TTYSize{Cols: t.Cols, Rows: t.Rows}
}

func networkView(n *hostnet.Info) wire.NetworkInfo {
	out := wire.NetworkInfo{SandboxID: n.SandboxID, Attached: n.Attached, IP: n.IP, Secrets: n.Secrets,
		Policy: wire.NetworkPolicy{Mode: string(n.Policy.Mode), Allow: ruleStrings(n.Policy.Allow), Deny: ruleStrings(n.Policy.Deny),
			Effects: effectSettings(n.Policy.Effects)}}
	for _, p := range n.Ports {
		out.Ports = append(out.Ports, wire.PortInfo(p))
	}
	return out
}

func ruleStrings[R interface{ String() string }](rules []R) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.String())
	}
	return out
}

func poolView(p daemon.PoolStatus) wire.PoolStatus {
	return wire.PoolStatus{
		Template: p.Template, Size: p.Size, Runtime: p.Runtime, Resources: wire.Resources(p.Resources),
		Auto: p.Auto, Min: p.Min, Max: p.Max,
		Fingerprint: p.Fingerprint, Target: p.Target, Ready: p.Ready, Starting: p.Starting, Hits: p.Hits, Misses: p.Misses,
		ClaimP50Micros: p.ClaimP50Micros, ClaimP99Micros: p.ClaimP99Micros, IdleMemoryBytes: p.IdleMemoryBytes,
		State: p.State, Error: p.Error, RetryAt: p.RetryAt,
	}
}

func poolViews(list []daemon.PoolStatus) []wire.PoolStatus {
	out := make([]wire.PoolStatus, 0, len(list))
	for _, p := range list {
		out = append(out, poolView(p))
	}
	return out
}

func secretViews(list []hostnet.SecretInfo) []wire.SecretInfo {
	out := make([]wire.SecretInfo, 0, len(list))
	for _, s := range list {
		out = append(out, wire.SecretInfo(s))
	}
	return out
}

func forkView(r checkpoint.ForkResult) wire.ForkResult {
	return wire.ForkResult{Parent: r.Parent, Snapshot: r.Snapshot, Mode: r.Mode, Reason: r.Reason,
		Sandboxes: sandboxViews(r.Sandboxes), Millis: r.Millis}
}

func usageLines(list []admission.UsageLine) []wire.UsageLine {
	out := make([]wire.UsageLine, 0, len(list))
	for _, u := range list {
		out = append(out, wire.UsageLine{
			SandboxID: u.SandboxID, Owner: u.Owner, Template: u.Template, State: wire.State(u.State),
			Reserved: wire.Resources(u.Reserved), Sandboxes: u.Sandboxes,
			CPUSeconds: u.CPUSeconds, MemGiBSeconds: u.MemGiBSeconds, MemAvgMiB: u.MemAvgMiB, MemPeakMiB: u.MemPeakMiB,
			RunningSeconds: u.RunningSeconds, FrozenSeconds: u.FrozenSeconds, PausedSeconds: u.PausedSeconds,
			StoppedSeconds: u.StoppedSeconds, DiskGiBHours: u.DiskGiBHours, CostReserved: u.CostReserved,
			CostActive: u.CostActive, LastActiveAt: u.LastActiveAt,
		})
	}
	return out
}

func usageView(r admission.UsageReport) wire.UsageReport {
	return wire.UsageReport{Since: r.Since, Prices: wire.Prices(r.Prices), Owners: usageLines(r.Owners), Sandboxes: usageLines(r.Sandboxes)}
}

func orphanView(r admission.OrphanReport) wire.OrphanReport {
	out := wire.OrphanReport{Days: r.Days, Items: make([]wire.Orphan, 0, len(r.Items))}
	for _, o := range r.Items {
		out.Items = append(out.Items, wire.Orphan{Kind: o.Kind, ID: o.ID, Owner: o.Owner, State: o.State, Template: o.Template,
			CreatedAt: o.CreatedAt, LastActiveAt: o.LastActiveAt, AgeDays: o.AgeDays, IdleDays: o.IdleDays,
			CostReserved: o.CostReserved, CostActive: o.CostActive, Reserved: wire.Resources(o.Reserved),
			CostPerDayReserved: o.CostPerDayReserved, CostPerDayActive: o.CostPerDayActive})
	}
	return out
}

func quotaView(q admission.QuotaInfo) wire.QuotaInfo {
	return wire.QuotaInfo{Owner: q.Owner, Source: q.Source, Limits: wire.QuotaLimits(q.Limits), Use: wire.QuotaUse(q.Use)}
}

func quotaViews(list []admission.QuotaInfo) []wire.QuotaInfo {
	out := make([]wire.QuotaInfo, 0, len(list))
	for _, q := range list {
		out = append(out, quotaView(q))
	}
	return out
}

package reaper

import (
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// Action is what the reaper does to a sandbox.
type Action string

const (
	None       Action = "none"
	Pause      Action = "pause"      // first step, in Decision.Mode
	PauseDisk  Action = "pause-disk" // demote a memory/freeze pause to disk
	Stop       Action = "stop"
	Delete     Action = "delete"
	Throttle   Action = "throttle"   // lower the CPU quota to the policy's throttle_cpu
	Unthrottle Action = "unthrottle" // restore the sandbox's own CPU quota
)

// Sandbox is the part of a sandbox Decide looks at.
type Sandbox struct {
	State        sandbox.State
	PauseActual  sandbox.PauseMode
	ExpiryAction sandbox.ExpiryAction
	// Since floors every "last busy" time: the sandbox's creation, or the
	// daemon's knowledge of it. Never the zero time (no "idle since epoch").
	Since time.Time
}

// Signals is what the daemon observed about a sandbox. Counters are "now";
// Last* are the last time each signal was busy (zero: never).
type Signals struct {
	Clients    int       // open exec/attach/file/watch streams (API surfaces + agent)
	LeaseUntil time.Time // active lease end (`berth lease`)
	Egress     int       // outbound requests in flight through the egress proxy

	LastClient time.Time
	LastAPI    time.Time
	LastWrite  time.Time
	LastEgress time.Time
	LastCPU    time.Time // last sample at or above the policy's CPU threshold

	// CPU is the latest sample's use as a fraction of the effective
	// allocation (the throttled quota while throttled).
	CPU float64
	// SpinSince is when CPU went continuously to ≥ spin threshold (zero: not spinning).
	SpinSince   time.Time
	ThrottledAt time.Time // zero: not throttled
}

// Decision is what to do, why, and with which signals.
type Decision struct {
	Action  Action
	Mode    sandbox.PauseMode // for Pause
	Reason  string
	IdleFor time.Duration
}

// QuietSince is when the last signal went quiet: the start of idleness.
func QuietSince(sb Sandbox, sig Signals, now time.Time) time.Time {
	t := sb.Since
	for _, l := range []time.Time{sig.LastClient, sig.LastAPI, sig.LastWrite, sig.LastEgress, sig.LastCPU} {
		if l.After(t) {
			t = l
		}
	}
	if sig.Clients > 0 || sig.Egress > 0 || now.Before(sig.LeaseUntil) {
		t = now
	}
	if t.After(now) {
		t = now
	}
	return t
}

// Decide is the reaper's whole policy. Suspend before kill: a running
// sandbox is only ever paused (or throttled); stop and delete happen to
// sandboxes already paused or stopped.
func Decide(now time.Time, sb Sandbox, sig Signals, pol Policy) Decision {
	if pol.Never {
		if !sig.ThrottledAt.IsZero() {
			return Decision{Action: Unthrottle, Reason: "policy_never"}
		}
		return Decision{Action: None, Reason: "policy_never"}
	}
	// Every signal counts as busy at Since at the latest: a sandbox the
	// daemon has just learned of (created, or adopted after a restart
	// without history) is never idle since the epoch.
	for _, l := range []*time.Time{&sig.LastClient, &sig.LastAPI, &sig.LastWrite, &sig.LastEgress, &sig.LastCPU} {
		if l.Before(sb.Since) {
			*l = sb.Since
		}
	}
	leased := now.Before(sig.LeaseUntil)
	attended := sig.Clients > 0 || leased || sig.Egress > 0
	idleFor := now.Sub(QuietSince(sb, sig, now))
	d := func(a Action, reason string) Decision { return Decision{Action: a, Reason: reason, IdleFor: idleFor} }

	switch sb.State {
	case sandbox.Running:
		if !sig.ThrottledAt.IsZero() && attended {
			return d(Unthrottle, "attended")
		}
		if !sig.SpinSince.IsZero() && now.Sub(sig.SpinSince) >= pol.SpinWindow.D() && !attended &&
			quiet(now, sig.LastClient, pol.ClientIdle) {
			switch {
			case sig.ThrottledAt.IsZero():
				return d(Throttle, "cpu_spin")
			case now.Sub(sig.ThrottledAt) >= pol.SpinPauseAfter.D():
				out := d(Pause, "cpu_spin")
				out.Mode = pol.PauseMode
				return out
			}
			return d(None, "cpu_spin_throttled")
		}
		if why := busy(now, sig, pol); why != "" {
			return d(None, why)
		}
		out := d(Pause, "idle")
		out.Mode = pol.PauseMode
		return out
	case sandbox.Paused:
		if leased {
			return d(None, "busy:lease")
		}
		if idleFor >= pol.ArchiveAfter.D() {
			switch sb.ExpiryAction {
			case sandbox.ExpireDelete:
				return d(Delete, "idle_archive")
			case sandbox.ExpireStop:
				return d(Stop, "idle_archive")
			}
		}
		if idleFor >= pol.DiskAfter.D() && sb.PauseActual != sandbox.PauseDisk {
			return d(PauseDisk, "idle_long")
		}
		return d(None, "paused")
	case sandbox.Stopped:
		if !leased && sb.ExpiryAction == sandbox.ExpireDelete && idleFor >= pol.ArchiveAfter.D() {
			return d(Delete, "idle_archive")
		}
		return d(None, "stopped")
	}
	return d(None, "state_"+string(sb.State))
}

func quiet(now, last time.Time, window Duration) bool {
	return last.IsZero() || now.Sub(last) >= window.D()
}

// busy names the first signal that keeps a running sandbox awake, or "".
func busy(now time.Time, sig Signals, pol Policy) string {
	switch {
	case sig.Clients > 0:
		return "busy:client"
	case now.Before(sig.LeaseUntil):
		return "busy:lease"
	case sig.Egress > 0:
		return "busy:egress"
	case !quiet(now, sig.LastClient, pol.ClientIdle):
		return "recent:client"
	case !quiet(now, sig.LastAPI, pol.APIIdle):
		return "recent:api"
	case !quiet(now, sig.LastWrite, pol.WriteIdle):
		return "recent:write"
	case !quiet(now, sig.LastEgress, pol.EgressIdle):
		return "recent:egress"
	case !quiet(now, sig.LastCPU, pol.CPUIdle):
		return "recent:cpu"
	}
	return ""
}

// Data renders the signals for an event: every action carries what led to it.
func (s Signals) Data(now time.Time) map[string]string {
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return now.Sub(t).Round(time.Millisecond).String()
	}
	m := map[string]string{
		"clients":           strconv.Itoa(s.Clients),
		"egress_inflight":   strconv.Itoa(s.Egress),
		"cpu":               strconv.FormatFloat(s.CPU, 'f', 3, 64),
		"last_client_ago":   ago(s.LastClient),
		"last_api_ago":      ago(s.LastAPI),
		"last_write_ago":    ago(s.LastWrite),
		"last_egress_ago":   ago(s.LastEgress),
		"last_cpu_busy_ago": ago(s.LastCPU),
	}
	if now.Before(s.LeaseUntil) {
		m["lease_until"] = s.LeaseUntil.UTC().Format(time.RFC3339)
	}
	if !s.SpinSince.IsZero() {
		m["spinning_for"] = ago(s.SpinSince)
	}
	if !s.ThrottledAt.IsZero() {
		m["throttled_for"] = ago(s.ThrottledAt)
	}
	return m
}

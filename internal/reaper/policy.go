// Package reaper decides, as a pure function of time, a sandbox and its
// activity signals, whether an abandoned sandbox should be parked or removed:
// idle → pause → pause to disk → stop/delete (per the sandbox's expiry
// action), and a CPU-spin detector that throttles, then pauses, a sandbox
// pinning its CPU with nobody attached. The daemon runs Decide in a thin loop
// and applies the decision; nothing here does I/O.
package reaper

import (
	"sort"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/duration"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Duration is a time.Duration that reads JSON in berth's one duration
// grammar ("90s", "15m", "1d", or a number of seconds: internal/duration)
// and writes it as "1h30m0s".
type Duration = duration.Duration

// Built-in policy names. "never" switches the reaper off for a sandbox (its
// expiry still applies: that is a separate promise).
const (
	PolicyDefault = "default"
	PolicyNever   = "never"
)

// Policy is one named idle policy. Each signal has its own quiet window; a
// sandbox is idle when every signal has been quiet for its window. The
// ladder's later steps count from the moment the last signal went quiet.
type Policy struct {
	Name  string `json:"-"`
	Never bool   `json:"never,omitempty"`

	ClientIdle Duration `json:"client_idle,omitempty"` // no open exec/attach/file stream
	APIIdle    Duration `json:"api_idle,omitempty"`    // no API call touching the sandbox
	WriteIdle  Duration `json:"write_idle,omitempty"`  // no file written inside the sandbox
	EgressIdle Duration `json:"egress_idle,omitempty"` // no outbound request in flight
	CPUIdle    Duration `json:"cpu_idle,omitempty"`    // CPU below CPUThreshold
	// CPUThreshold is the fraction of the sandbox's CPU allocation below which
	// it counts as idle (0.05 = 5% of its cores).
	CPUThreshold float64 `json:"cpu_threshold,omitempty"`
	// PauseMode of the first step: freeze, memory or disk; "" lets the daemon
	// pick (memory where the runtime can checkpoint, else disk).
	PauseMode sandbox.PauseMode `json:"pause_mode,omitempty"`
	// DiskAfter: idle this long → pause --mode disk (frees RAM and images).
	DiskAfter Duration `json:"disk_after,omitempty"`
	// ArchiveAfter: idle this long → the sandbox's expiry action (stop or delete).
	ArchiveAfter Duration `json:"archive_after,omitempty"`

	// CPU-spin detector: CPU at or above SpinThreshold of its allocation for
	// SpinWindow with no client, lease or egress → throttle to ThrottleCPU
	// cores; still spinning SpinPauseAfter later → pause.
	SpinThreshold  float64  `json:"spin_threshold,omitempty"`
	SpinWindow     Duration `json:"spin_window,omitempty"`
	ThrottleCPU    float64  `json:"throttle_cpu,omitempty"`
	SpinPauseAfter Duration `json:"spin_pause_after,omitempty"`
}

// DefaultPolicy is the built-in "default" policy.
func DefaultPolicy() Policy {
	return Policy{
		Name:       PolicyDefault,
		ClientIdle: Duration(10 * time.Minute), APIIdle: Duration(10 * time.Minute),
		WriteIdle: Duration(10 * time.Minute), EgressIdle: Duration(10 * time.Minute),
		CPUIdle: Duration(10 * time.Minute), CPUThreshold: 0.05,
		DiskAfter: Duration(2 * time.Hour), ArchiveAfter: Duration(7 * 24 * time.Hour),
		SpinThreshold: 0.9, SpinWindow: Duration(30 * time.Minute), ThrottleCPU: 0.1,
		SpinPauseAfter: Duration(30 * time.Minute),
	}
}

// withDefaults fills zero fields from base.
func (p Policy) withDefaults(base Policy) Policy {
	fill := func(d *Duration, b Duration) {
		if *d == 0 {
			*d = b
		}
	}
	fill(&p.ClientIdle, base.ClientIdle)
	fill(&p.APIIdle, base.APIIdle)
	fill(&p.WriteIdle, base.WriteIdle)
	fill(&p.EgressIdle, base.EgressIdle)
	fill(&p.CPUIdle, base.CPUIdle)
	fill(&p.DiskAfter, base.DiskAfter)
	fill(&p.ArchiveAfter, base.ArchiveAfter)
	fill(&p.SpinWindow, base.SpinWindow)
	fill(&p.SpinPauseAfter, base.SpinPauseAfter)
	if p.CPUThreshold == 0 {
		p.CPUThreshold = base.CPUThreshold
	}
	if p.SpinThreshold == 0 {
		p.SpinThreshold = base.SpinThreshold
	}
	if p.ThrottleCPU == 0 {
		p.ThrottleCPU = base.ThrottleCPU
	}
	if p.PauseMode == "" {
		p.PauseMode = base.PauseMode
	}
	return p
}

// longestIdle is the longest per-signal window: the ladder's first step.
func (p Policy) longestIdle() time.Duration {
	m := p.ClientIdle
	for _, d := range []Duration{p.APIIdle, p.WriteIdle, p.EgressIdle, p.CPUIdle} {
		m = max(m, d)
	}
	return m.D()
}

func (p Policy) validate(key string) error {
	if p.Never {
		return nil
	}
	for name, d := range map[string]Duration{"client_idle": p.ClientIdle, "api_idle": p.APIIdle,
		"write_idle": p.WriteIdle, "egress_idle": p.EgressIdle, "cpu_idle": p.CPUIdle,
		"disk_after": p.DiskAfter, "archive_after": p.ArchiveAfter, "spin_window": p.SpinWindow,
		"spin_pause_after": p.SpinPauseAfter} {
		if d <= 0 {
			return errs.Field(key+"."+name, "must be a positive duration")
		}
	}
	if p.DiskAfter.D() < p.longestIdle() {
		return errs.Field(key+".disk_after", "must be at least the longest idle window (%s)", p.longestIdle())
	}
	if p.ArchiveAfter < p.DiskAfter {
		return errs.Field(key+".archive_after", "must be at least disk_after (%s)", p.DiskAfter.D())
	}
	if p.CPUThreshold <= 0 || p.CPUThreshold > 1 {
		return errs.Field(key+".cpu_threshold", "must be in (0, 1], a fraction of the sandbox's cores")
	}
	if p.SpinThreshold <= p.CPUThreshold || p.SpinThreshold > 1 {
		return errs.Field(key+".spin_threshold", "must be above cpu_threshold and at most 1")
	}
	if p.ThrottleCPU < 0.01 {
		return errs.Field(key+".throttle_cpu", "must be at least 0.01 cores")
	}
	if p.PauseMode != "" {
		if err := sandbox.ValidPauseMode(p.PauseMode); err != nil {
			return errs.Field(key+".pause_mode", "must be one of freeze, memory, disk; got %q", p.PauseMode)
		}
	}
	return nil
}

// Config is the server's reaper configuration (the "reaper" key of
// `berth serve --config`).
type Config struct {
	// Interval between sampling rounds (signals, metering, decisions).
	Interval Duration `json:"interval,omitempty"`
	// DefaultPolicy applies when neither the sandbox nor its template names one.
	DefaultPolicy string `json:"default_policy,omitempty"`
	// TemplatePolicies maps template name → policy name.
	TemplatePolicies map[string]string `json:"template_policies,omitempty"`
	// Policies are named policies; zero fields are taken from "default"
	// (which may itself be overridden here).
	Policies map[string]Policy `json:"policies,omitempty"`
}

// SetDefaults fills the interval and default policy name.
func (c *Config) SetDefaults() {
	if c.Interval == 0 {
		c.Interval = Duration(10 * time.Second)
	}
	if c.DefaultPolicy == "" {
		c.DefaultPolicy = PolicyDefault
	}
}

// Validate checks every policy and reference; errors name the config key.
func (c Config) Validate() error {
	if c.Interval < 0 {
		return errs.Field("reaper.interval", "must be positive")
	}
	names := c.Names()
	known := map[string]bool{}
	for _, n := range names {
		known[n] = true
	}
	for n := range c.Policies {
		if n == PolicyNever {
			return errs.Field("reaper.policies.never", "is built in and cannot be redefined")
		}
		if !validName(n) {
			return errs.Field("reaper.policies", "policy name %q must be 1-32 of [a-z0-9_-]", n)
		}
		p, _ := c.Policy(n)
		if err := p.validate("reaper.policies." + n); err != nil {
			return err
		}
	}
	if c.DefaultPolicy != "" && !known[c.DefaultPolicy] {
		return errs.Field("reaper.default_policy", "unknown policy %q; known: %s", c.DefaultPolicy, strings.Join(names, ", "))
	}
	for tpl, n := range c.TemplatePolicies {
		if !known[n] {
			return errs.Field("reaper.template_policies."+tpl, "unknown policy %q; known: %s", n, strings.Join(names, ", "))
		}
	}
	return nil
}

func validName(n string) bool {
	if n == "" || len(n) > 32 {
		return false
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Names lists every policy name, built-ins included, sorted.
func (c Config) Names() []string {
	set := map[string]bool{PolicyDefault: true, PolicyNever: true}
	for n := range c.Policies {
		set[n] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Policy returns the named policy with defaults filled in.
func (c Config) Policy(name string) (Policy, bool) {
	base := DefaultPolicy()
	if o, ok := c.Policies[PolicyDefault]; ok {
		base = o.withDefaults(base)
	}
	base.Name = PolicyDefault
	switch name {
	case PolicyNever:
		return Policy{Name: PolicyNever, Never: true}, true
	case PolicyDefault:
		return base, true
	}
	p, ok := c.Policies[name]
	if !ok {
		return Policy{}, false
	}
	p = p.withDefaults(base)
	p.Name = name
	return p, true
}

// CheckName validates a policy name a caller asked for (create --idle-policy).
func (c Config) CheckName(field, name string) error {
	if _, ok := c.Policy(name); !ok {
		return errs.Field(field, "unknown idle policy %q; known: %s", name, strings.Join(c.Names(), ", "))
	}
	return nil
}

// Resolve picks a sandbox's policy: its own, else its template's, else the
// server default. An unknown name (a policy removed from the config since)
// falls back to the default rather than to "never": nothing abandoned keeps
// billing.
func (c Config) Resolve(sandboxPolicy, template string) Policy {
	for _, n := range []string{sandboxPolicy, c.TemplatePolicies[template], c.DefaultPolicy} {
		if n == "" {
			continue
		}
		if p, ok := c.Policy(n); ok {
			return p
		}
	}
	p, _ := c.Policy(PolicyDefault)
	return p
}

// Package quota holds per-owner maximums and the pure admission check: does
// adding one more sandbox (or snapshot) keep an owner within its limits?
// The daemon runs Check and the insert under one lock, so concurrent creates
// cannot both squeeze under a limit.
package quota

import (
	"fmt"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Limits are an owner's maximums; zero means unlimited.
type Limits struct {
	Sandboxes int     `json:"sandboxes,omitempty"` // concurrent sandboxes (not stopped, failed or deleted)
	CPU       float64 `json:"cpu,omitempty"`       // total vCPU of those sandboxes
	MemoryMiB int64   `json:"memory_mib,omitempty"`
	DiskMiB   int64   `json:"disk_mib,omitempty"` // total disk of every sandbox not deleted (stopped ones keep theirs)
	Snapshots int     `json:"snapshots,omitempty"`
}

// Validate names the bad field under prefix.
func (l Limits) Validate(prefix string) error {
	switch {
	case l.Sandboxes < 0:
		return errs.Field(prefix+"sandboxes", "must not be negative")
	case l.CPU < 0:
		return errs.Field(prefix+"cpu", "must not be negative")
	case l.MemoryMiB < 0:
		return errs.Field(prefix+"memory_mib", "must not be negative")
	case l.DiskMiB < 0:
		return errs.Field(prefix+"disk_mib", "must not be negative")
	case l.Snapshots < 0:
		return errs.Field(prefix+"snapshots", "must not be negative")
	}
	return nil
}

// Config is the server's quota configuration (the "quotas" key): a default
// for every owner and per-owner overrides. Limits set through the admin API
// are stored and win over both.
type Config struct {
	Default Limits            `json:"default,omitzero"`
	Owners  map[string]Limits `json:"owners,omitempty"`
}

// Validate names the bad key.
func (c Config) Validate() error {
	if err := c.Default.Validate("quotas.default."); err != nil {
		return err
	}
	for o, l := range c.Owners {
		if err := l.Validate("quotas.owners." + o + "."); err != nil {
			return err
		}
	}
	return nil
}

// For returns the configured limits of owner.
func (c Config) For(owner string) Limits {
	if l, ok := c.Owners[owner]; ok {
		return l
	}
	return c.Default
}

// Use is what an owner holds now.
type Use struct {
	Sandboxes int     `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskMiB   int64   `json:"disk_mib"`
	Snapshots int     `json:"snapshots"`
}

// Live reports whether a sandbox in state st counts toward the concurrent
// sandbox, CPU and memory limits (a paused sandbox can resume at any time).
func Live(st sandbox.State) bool {
	switch st {
	case sandbox.Stopped, sandbox.Failed, sandbox.Deleted:
		return false
	}
	return true
}

// Tally sums what the given sandboxes hold.
func Tally(list []*sandbox.Sandbox) Use {
	var u Use
	for _, sb := range list {
		if sb.State == sandbox.Deleted {
			continue
		}
		u.DiskMiB += sb.Resources.DiskMiB
		if Live(sb.State) {
			u.Sandboxes++
			u.CPU += float64(sb.Resources.CPUMillis) / 1000
			u.MemoryMiB += sb.Resources.MemoryMiB
		}
	}
	return u
}

// Check returns a ResourceExhausted error naming the first limit that one
// more sandbox of size r would exceed.
func Check(owner string, l Limits, u Use, r sandbox.Resources) error {
	cpu := float64(r.CPUMillis) / 1000
	switch {
	case l.Sandboxes > 0 && u.Sandboxes+1 > l.Sandboxes:
		return exceeded(owner, "sandboxes", fmt.Sprint(l.Sandboxes), fmt.Sprint(u.Sandboxes), "1 more")
	case l.CPU > 0 && u.CPU+cpu > l.CPU+1e-9:
		return exceeded(owner, "cpu", fmt.Sprintf("%g vCPU", l.CPU), fmt.Sprintf("%g", u.CPU), fmt.Sprintf("%g more", cpu))
	case l.MemoryMiB > 0 && u.MemoryMiB+r.MemoryMiB > l.MemoryMiB:
		return exceeded(owner, "memory_mib", fmt.Sprintf("%d MiB", l.MemoryMiB), fmt.Sprint(u.MemoryMiB), fmt.Sprintf("%d more", r.MemoryMiB))
	case l.DiskMiB > 0 && u.DiskMiB+r.DiskMiB > l.DiskMiB:
		return exceeded(owner, "disk_mib", fmt.Sprintf("%d MiB", l.DiskMiB), fmt.Sprint(u.DiskMiB), fmt.Sprintf("%d more", r.DiskMiB))
	}
	return nil
}

// CheckSnapshot is Check for one more snapshot.
func CheckSnapshot(owner string, l Limits, u Use) error {
	if l.Snapshots > 0 && u.Snapshots+1 > l.Snapshots {
		return exceeded(owner, "snapshots", fmt.Sprint(l.Snapshots), fmt.Sprint(u.Snapshots), "1 more")
	}
	return nil
}

func exceeded(owner, limit, max, used, asked string) error {
	return &errs.Error{Kind: errs.ResourceExhausted, Field: limit,
		Message: fmt.Sprintf("quota exceeded: owner %s limit %s is %s (in use %s, asked for %s)", owner, limit, max, used, asked)}
}

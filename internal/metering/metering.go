// Package metering turns periodic cgroup and disk samples of a sandbox into
// usage aggregates, and usage into cost on two bases side by side: what was
// reserved (wall-clock × reserved size) and what was used (active CPU and
// memory). Pure: the daemon samples, persists and reports.
package metering

import (
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

const gib = float64(1 << 30)

// Wall-clock buckets.
const (
	BucketRunning = "running" // creating, running, pausing, resuming: the sandbox holds CPU and RAM
	BucketFrozen  = "frozen"  // paused with the freezer: RAM held, no CPU
	BucketPaused  = "paused"  // paused to memory image or disk: disk only
	BucketStopped = "stopped" // stopped or failed: disk only
)

// BucketOf maps a sandbox state to its wall-clock bucket ("" = not metered).
func BucketOf(st sandbox.State, actual sandbox.PauseMode) string {
	switch st {
	case sandbox.Creating, sandbox.Running, sandbox.Pausing, sandbox.Resuming:
		return BucketRunning
	case sandbox.Paused:
		if actual == sandbox.PauseFreeze {
			return BucketFrozen
		}
		return BucketPaused
	case sandbox.Stopped, sandbox.Failed:
		return BucketStopped
	}
	return ""
}

// Usage is one sandbox's accumulated usage, plus the cursor of the last sample.
type Usage struct {
	SandboxID string            `json:"sandbox_id"`
	Owner     string            `json:"owner"`
	Template  string            `json:"template"`
	Reserved  sandbox.Resources `json:"reserved"`
	State     sandbox.State     `json:"state"`
	CreatedAt time.Time         `json:"created_at"`

	CPUSeconds     float64 `json:"cpu_seconds"`
	MemGiBSeconds  float64 `json:"memory_gib_seconds"`
	MemPeakBytes   uint64  `json:"memory_peak_bytes"`
	RunningSeconds float64 `json:"running_seconds"`
	FrozenSeconds  float64 `json:"frozen_seconds"`
	PausedSeconds  float64 `json:"paused_seconds"`
	StoppedSeconds float64 `json:"stopped_seconds"`
	DiskGiBHours   float64 `json:"disk_gib_hours"`
	DiskBytes      uint64  `json:"disk_bytes"` // latest sample: workspace blocks + memory images

	// Cursor: when the last sample was taken and the cgroup CPU counter then
	// (0 when the sandbox had no cgroup, so a fresh cgroup counts from zero).
	LastSampleAt time.Time `json:"last_sample_at,omitzero"`
	LastCPUNanos uint64    `json:"-"`
	// LastActiveAt is the reaper's latest "last busy" time, persisted so a
	// restarted daemon re-derives idleness instead of guessing.
	LastActiveAt time.Time `json:"last_active_at,omitzero"`
	// Signals is the reaper's persisted per-signal state (opaque JSON).
	Signals string `json:"-"`
}

// MemAvgBytes is the average memory over metered running+frozen time.
func (u Usage) MemAvgBytes() float64 {
	t := u.RunningSeconds + u.FrozenSeconds
	if t <= 0 {
		return 0
	}
	return u.MemGiBSeconds / t * gib
}

// Sample is one observation.
type Sample struct {
	At        time.Time
	Bucket    string
	HasCgroup bool // CPU and memory below are valid
	CPUNanos  uint64
	MemBytes  uint64
	MemPeak   uint64
	DiskBytes uint64
}

// Add folds a sample into u. The interval since the previous sample is
// attributed to the state seen now; CPU is the counter's delta (a counter
// lower than the cursor means a new cgroup, which counts from zero).
func Add(u Usage, s Sample) Usage {
	if u.LastSampleAt.IsZero() || !s.At.After(u.LastSampleAt) {
		if u.LastSampleAt.IsZero() {
			u.LastSampleAt = s.At
			if s.HasCgroup {
				u.CPUSeconds += float64(s.CPUNanos) / 1e9
				u.LastCPUNanos = s.CPUNanos
				u.MemPeakBytes = max(u.MemPeakBytes, s.MemPeak, s.MemBytes)
			}
			u.DiskBytes = s.DiskBytes
		}
		return u
	}
	dt := s.At.Sub(u.LastSampleAt).Seconds()
	switch s.Bucket {
	case BucketRunning:
		u.RunningSeconds += dt
	case BucketFrozen:
		u.FrozenSeconds += dt
	case BucketPaused:
		u.PausedSeconds += dt
	case BucketStopped:
		u.StoppedSeconds += dt
	}
	if s.HasCgroup {
		delta := s.CPUNanos
		if s.CPUNanos >= u.LastCPUNanos {
			delta = s.CPUNanos - u.LastCPUNanos
		}
		u.CPUSeconds += float64(delta) / 1e9
		u.LastCPUNanos = s.CPUNanos
		u.MemGiBSeconds += float64(s.MemBytes) / gib * dt
		u.MemPeakBytes = max(u.MemPeakBytes, s.MemPeak, s.MemBytes)
	} else {
		u.LastCPUNanos = 0
	}
	// Disk held over the interval: the mean of both ends.
	u.DiskGiBHours += (float64(u.DiskBytes) + float64(s.DiskBytes)) / 2 / gib * dt / 3600
	u.DiskBytes = s.DiskBytes
	u.LastSampleAt = s.At
	return u
}

// Prices are per hour, in one currency (server config "prices").
type Prices struct {
	Currency      string  `json:"currency,omitempty"`
	VCPUHour      float64 `json:"vcpu_hour,omitempty"`
	MemoryGiBHour float64 `json:"memory_gib_hour,omitempty"`
	DiskGiBHour   float64 `json:"disk_gib_hour,omitempty"`
}

// DefaultPrices are illustrative, roughly public-cloud on-demand.
func DefaultPrices() Prices {
	return Prices{Currency: "USD", VCPUHour: 0.04, MemoryGiBHour: 0.005, DiskGiBHour: 0.0001}
}

// Validate names the bad key.
func (p Prices) Validate() error {
	for k, v := range map[string]float64{"prices.vcpu_hour": p.VCPUHour, "prices.memory_gib_hour": p.MemoryGiBHour, "prices.disk_gib_hour": p.DiskGiBHour} {
		if v < 0 {
			return errs.Field(k, "must not be negative")
		}
	}
	return nil
}

// Cost is one usage priced on both bases.
type Cost struct {
	// Reserved: running seconds × (reserved vCPU + reserved GiB), frozen
	// seconds × reserved GiB, every metered second × reserved disk GiB.
	Reserved float64 `json:"reserved"`
	// Active: CPU-seconds used + memory GiB-seconds used + disk GiB-hours allocated.
	Active float64 `json:"active"`
}

// Price prices one usage.
func Price(u Usage, p Prices) Cost {
	vcpu := float64(u.Reserved.CPUMillis) / 1000
	memGiB := float64(u.Reserved.MemoryMiB) / 1024
	diskGiB := float64(u.Reserved.DiskMiB) / 1024
	all := u.RunningSeconds + u.FrozenSeconds + u.PausedSeconds + u.StoppedSeconds
	reserved := (u.RunningSeconds*(vcpu*p.VCPUHour+memGiB*p.MemoryGiBHour) +
		u.FrozenSeconds*memGiB*p.MemoryGiBHour + all*diskGiB*p.DiskGiBHour) / 3600
	active := (u.CPUSeconds*p.VCPUHour+u.MemGiBSeconds*p.MemoryGiBHour)/3600 + u.DiskGiBHours*p.DiskGiBHour
	return Cost{Reserved: reserved, Active: active}
}

// Total sums usages (for an owner's line).
func Total(list []Usage) Usage {
	var t Usage
	for _, u := range list {
		t.CPUSeconds += u.CPUSeconds
		t.MemGiBSeconds += u.MemGiBSeconds
		t.MemPeakBytes = max(t.MemPeakBytes, u.MemPeakBytes)
		t.RunningSeconds += u.RunningSeconds
		t.FrozenSeconds += u.FrozenSeconds
		t.PausedSeconds += u.PausedSeconds
		t.StoppedSeconds += u.StoppedSeconds
		t.DiskGiBHours += u.DiskGiBHours
		t.DiskBytes += u.DiskBytes
	}
	return t
}

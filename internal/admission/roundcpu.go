package admission

import (
	"syscall"
	"time"
)

// RoundStats is what the last reaper round cost: its wall time and the
// CPU the daemon spent during it, split between metering (cgroup and disk
// sampling, usage rows) and reaping (agent activity, decisions, actions).
type RoundStats struct {
	At        time.Time
	Sandboxes int
	Wall      time.Duration
	// MeterCPU and ReapCPU are process CPU (user+system of the daemon and
	// of the runtime commands it waited for) measured around each phase.
	// They are process-wide, so work served concurrently by other
	// goroutines is counted too: on a quiet daemon they are the round's cost.
	MeterCPU, ReapCPU time.Duration
	Rounds            uint64 // rounds since the daemon started
}

// CPU is the round's total CPU.
func (s RoundStats) CPU() time.Duration { return s.MeterCPU + s.ReapCPU }

// processCPU is the CPU this process and its reaped children have used.
// getrusage, not runtime/metrics: the runtime commands a round runs (runc)
// are separate processes, and their cost is the round's.
func processCPU() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

// cpuMeter accumulates CPU per phase: each call charges the CPU used since
// the previous call to the phase named.
type cpuMeter struct {
	last        time.Duration
	meter, reap time.Duration
	now         func() time.Duration
}

func newCPUMeter() *cpuMeter {
	m := &cpuMeter{now: processCPU}
	m.last = m.now()
	return m
}

func (m *cpuMeter) charge(to *time.Duration) {
	t := m.now()
	*to += t - m.last
	m.last = t
}

// LastRound is the cost of the last completed reaper round (zero before the first).
func (a *Service) LastRound() RoundStats {
	a.mMu.Lock()
	defer a.mMu.Unlock()
	return a.lastRound
}

func (a *Service) observeRound(s RoundStats) {
	a.mMu.Lock()
	a.rounds++
	s.Rounds = a.rounds
	a.lastRound = s
	a.mMu.Unlock()
	a.core.Log().Debug("reaper round", "sandboxes", s.Sandboxes, "wall", s.Wall,
		"cpu", s.CPU(), "metering_cpu", s.MeterCPU, "reaping_cpu", s.ReapCPU)
}

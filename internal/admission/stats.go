package admission

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// SandboxStats is one reading of a running sandbox's resource use: its
// cgroup's CPU time and memory (for runsc, the whole sandbox's host cost)
// and the blocks its workspace image holds, with the limits they count
// against.
type SandboxStats struct {
	At        time.Time
	StartedAt time.Time
	CPUNanos  uint64 // cumulative since the cgroup was made
	CPUMillis int    // allocation
	MemBytes  uint64
	MemLimit  uint64
	DiskBytes uint64 // allocated blocks of the workspace (and memory images)
	DiskLimit uint64
}

// SandboxStats reads a running sandbox's usage now (owner "" = admin).
func (a *Service) SandboxStats(ctx context.Context, owner, id string) (SandboxStats, error) {
	sb, err := a.core.Visible(ctx, owner, id)
	if err != nil {
		return SandboxStats{}, err
	}
	if sb.State != sandbox.Running {
		return SandboxStats{}, errs.E(errs.FailedPrecondition, "sandbox %s is %s; usage is read from a running sandbox", id, sb.State)
	}
	rt, err := a.core.RuntimeFor(sb)
	if err != nil {
		return SandboxStats{}, err
	}
	st, err := rt.Stats(ctx, sb.ID)
	if err != nil {
		return SandboxStats{}, err
	}
	started := sb.StartedAt
	if started.IsZero() {
		started = sb.CreatedAt
	}
	return SandboxStats{
		At: a.core.Now(), StartedAt: started, CPUNanos: st.CPUUsageNanos, CPUMillis: sb.Resources.CPUMillis,
		MemBytes: st.MemoryBytes, MemLimit: uint64(max(sb.Resources.MemoryMiB, 0)) << 20,
		DiskBytes: a.DiskBytes(sb.ID), DiskLimit: uint64(max(sb.Resources.DiskMiB, 0)) << 20,
	}, nil
}

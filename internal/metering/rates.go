package metering

import "github.com/berth-dev/berth/internal/sandbox"

// ReservedPerDay is what reserved size r costs per day in wall-clock
// bucket b on the reserved basis (Price's rule for 24 hours in one
// bucket): running holds vCPU, memory and disk, frozen memory and disk,
// paused and stopped only disk. Unmetered ("") costs nothing.
func ReservedPerDay(b string, r sandbox.Resources, p Prices) float64 {
	u := Usage{Reserved: r}
	const day = 24 * 3600
	switch b {
	case BucketRunning:
		u.RunningSeconds = day
	case BucketFrozen:
		u.FrozenSeconds = day
	case BucketPaused:
		u.PausedSeconds = day
	case BucketStopped:
		u.StoppedSeconds = day
	default:
		return 0
	}
	return Price(u, p).Reserved
}

// ActivePerDay is what a sandbox in wall-clock bucket b costs per day on
// the active basis. Paused or stopped, it holds only its disk: the
// allocated bytes of its latest sample (diskBytes) for 24 hours. Running
// or frozen, it is its recent usage u priced and scaled to one day (cost
// over the metered seconds u covers, times 24 hours; 0 when u covers no
// time).
func ActivePerDay(b string, u Usage, diskBytes uint64, p Prices) float64 {
	switch b {
	case BucketPaused, BucketStopped:
		return float64(diskBytes) / gib * 24 * p.DiskGiBHour
	case BucketRunning, BucketFrozen:
	default:
		return 0
	}
	t := u.RunningSeconds + u.FrozenSeconds + u.PausedSeconds + u.StoppedSeconds
	if t <= 0 {
		return 0
	}
	return Price(u, p).Active / t * 24 * 3600
}

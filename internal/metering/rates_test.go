package metering

import (
	"math"
	"testing"

	"github.com/berth-dev/berth/internal/sandbox"
)

func TestPerDayRates(t *testing.T) {
	p := Prices{VCPUHour: 0.04, MemoryGiBHour: 0.005, DiskGiBHour: 0.0001}
	r := sandbox.Resources{CPUMillis: 2000, MemoryMiB: 1024, DiskMiB: 10240}
	for _, tc := range []struct {
		bucket string
		want   float64
	}{
		{BucketRunning, 24 * (2*0.04 + 1*0.005 + 10*0.0001)},
		{BucketFrozen, 24 * (1*0.005 + 10*0.0001)},
		{BucketPaused, 24 * 10 * 0.0001},
		{BucketStopped, 24 * 10 * 0.0001},
		{"", 0},
	} {
		if got := ReservedPerDay(tc.bucket, r, p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("ReservedPerDay(%q) = %v, want %v", tc.bucket, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name   string
		bucket string
		u      Usage
		disk   uint64
		want   float64
	}{
		// 1 h running using 0.5 vCPU-hour and 2 GiB-hours: 0.02 + 0.01 per hour, ×24.
		{"running hour", BucketRunning, Usage{RunningSeconds: 3600, CPUSeconds: 1800, MemGiBSeconds: 7200}, 1 << 30, 24 * (0.5*0.04 + 2*0.005)},
		// 12 h frozen holding 5 GiB-hours of disk: ×2.
		{"frozen half day", BucketFrozen, Usage{FrozenSeconds: 12 * 3600, DiskGiBHours: 5}, 0, 2 * 5 * 0.0001},
		// Paused or stopped: 3 GiB of disk for a day, whatever it used before.
		{"paused holds its disk", BucketPaused, Usage{RunningSeconds: 3600, CPUSeconds: 3600}, 3 << 30, 24 * 3 * 0.0001},
		{"stopped holds its disk", BucketStopped, Usage{}, 1 << 30, 24 * 0.0001},
		{"no time", BucketRunning, Usage{CPUSeconds: 10}, 0, 0},
		{"unmetered", "", Usage{RunningSeconds: 3600, CPUSeconds: 3600}, 1 << 30, 0},
	} {
		if got := ActivePerDay(tc.bucket, tc.u, tc.disk, p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("ActivePerDay(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

package metering

import (
	"math"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestAdd(t *testing.T) {
	const g = 1 << 30
	steps := []Sample{
		{At: t0, Bucket: BucketRunning, HasCgroup: true, CPUNanos: 1e9, MemBytes: g, MemPeak: g, DiskBytes: g},
		{At: t0.Add(10 * time.Second), Bucket: BucketRunning, HasCgroup: true, CPUNanos: 6e9, MemBytes: 2 * g, MemPeak: 3 * g, DiskBytes: g},
		{At: t0.Add(20 * time.Second), Bucket: BucketFrozen, HasCgroup: true, CPUNanos: 6e9, MemBytes: 2 * g, MemPeak: 3 * g, DiskBytes: g},
		{At: t0.Add(30 * time.Second), Bucket: BucketPaused, DiskBytes: 3 * g},
		// Booted again: a fresh cgroup counts from zero.
		{At: t0.Add(40 * time.Second), Bucket: BucketRunning, HasCgroup: true, CPUNanos: 2e9, MemBytes: 0, DiskBytes: g},
		{At: t0.Add(3640 * time.Second), Bucket: BucketStopped, DiskBytes: g},
		// A sample not after the cursor changes nothing.
		{At: t0.Add(3640 * time.Second), Bucket: BucketRunning, HasCgroup: true, CPUNanos: 9e9},
	}
	var u Usage
	for _, s := range steps {
		u = Add(u, s)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("cpu seconds", u.CPUSeconds, 1+5+0+2)
	near("memory GiB-s", u.MemGiBSeconds, 2*10+2*10+0)
	near("running s", u.RunningSeconds, 10+10) // an interval counts in the state seen at its end: 0-10 and 30-40
	near("frozen s", u.FrozenSeconds, 10)
	near("paused s", u.PausedSeconds, 10)
	near("stopped s", u.StoppedSeconds, 3600)
	near("disk GiB-h", u.DiskGiBHours, (10+10+20+20+3600)/3600.0)
	if u.MemPeakBytes != 3*g {
		t.Errorf("peak = %d, want %d", u.MemPeakBytes, 3*g)
	}
	if got := u.MemAvgBytes(); math.Abs(got-40.0/30*g) > 1 {
		t.Errorf("avg memory = %v", got)
	}
}

func TestPrice(t *testing.T) {
	u := Usage{
		Reserved:       sandbox.Resources{CPUMillis: 2000, MemoryMiB: 4096, DiskMiB: 10240},
		RunningSeconds: 3600, FrozenSeconds: 3600, PausedSeconds: 1800, StoppedSeconds: 1800,
		CPUSeconds: 1800, MemGiBSeconds: 3600, DiskGiBHours: 5,
	}
	p := Prices{VCPUHour: 1, MemoryGiBHour: 0.1, DiskGiBHour: 0.01}
	got := Price(u, p)
	wantReserved := 1*(2*1+4*0.1) + 1*(4*0.1) + 3*(10*0.01)
	wantActive := 0.5*1 + 1*0.1 + 5*0.01
	if math.Abs(got.Reserved-wantReserved) > 1e-9 || math.Abs(got.Active-wantActive) > 1e-9 {
		t.Errorf("Price = %+v, want reserved %v active %v", got, wantReserved, wantActive)
	}
	if err := (Prices{VCPUHour: -1}).Validate(); err == nil {
		t.Error("negative price accepted")
	}
}

func TestBucketOf(t *testing.T) {
	for _, tc := range []struct {
		st   sandbox.State
		mode sandbox.PauseMode
		want string
	}{
		{sandbox.Running, "", BucketRunning}, {sandbox.Creating, "", BucketRunning},
		{sandbox.Paused, sandbox.PauseFreeze, BucketFrozen}, {sandbox.Paused, sandbox.PauseMemory, BucketPaused},
		{sandbox.Paused, sandbox.PauseDisk, BucketPaused}, {sandbox.Stopped, "", BucketStopped},
		{sandbox.Failed, "", BucketStopped}, {sandbox.Deleted, "", ""},
	} {
		if got := BucketOf(tc.st, tc.mode); got != tc.want {
			t.Errorf("BucketOf(%s, %s) = %q, want %q", tc.st, tc.mode, got, tc.want)
		}
	}
}

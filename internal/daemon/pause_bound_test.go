package daemon

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// TestCheckpointTimeout: the bound of a checkpoint or restore is the base
// plus a share per started GiB of the sandbox's memory limit.
func TestCheckpointTimeout(t *testing.T) {
	cfg := Config{DataDir: "/var/lib/berth", AgentPath: "/usr/bin/berth-agent"}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: cfg}
	for _, c := range []struct {
		mib  int64
		want time.Duration
	}{
		{0, 10 * time.Second},
		{256, 15 * time.Second},
		{1024, 15 * time.Second},
		{1025, 20 * time.Second},
		{4096, 30 * time.Second},
	} {
		sb := &sandbox.Sandbox{Resources: sandbox.Resources{MemoryMiB: c.mib}}
		if got := d.checkpointTimeout(sb); got != c.want {
			t.Errorf("%d MiB: %v, want %v", c.mib, got, c.want)
		}
	}
	d.cfg.CheckpointTimeout, d.cfg.CheckpointTimeoutPerGiB = 2*time.Second, time.Second
	if got := d.checkpointTimeout(&sandbox.Sandbox{Resources: sandbox.Resources{MemoryMiB: 2048}}); got != 4*time.Second {
		t.Errorf("configured 2s + 1s/GiB at 2 GiB: %v, want 4s", got)
	}
	bad := cfg
	bad.CheckpointTimeout = -time.Second
	if err := bad.Validate(); err == nil {
		t.Errorf("a negative checkpoint_timeout validated")
	}
}

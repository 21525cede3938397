package daemon

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/checkpoint"
)

// TestCheckpointConfig: the checkpoint services get the configured bounds
// (defaults included), and a negative bound does not validate.
func TestCheckpointConfig(t *testing.T) {
	cfg := Config{DataDir: "/var/lib/berth", AgentPath: "/usr/bin/berth-agent"}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	got := checkpoint.Timeout(cfg.CheckpointTimeout, cfg.CheckpointTimeoutPerGiB, 1025)
	if got != 20*time.Second {
		t.Errorf("default bound at 1025 MiB: %v, want 20s", got)
	}
	bad := cfg
	bad.CheckpointTimeout = -time.Second
	if err := bad.Validate(); err == nil {
		t.Errorf("a negative checkpoint_timeout validated")
	}
}

//go:build linux && !clientonly

package main

import (
	"log/slog"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/server"
)

// CheckpointConfig is how `berth serve` bounds and trusts memory checkpoints.
type CheckpointConfig struct {
	// CheckpointTimeout + CheckpointTimeoutPerGiB × a sandbox's memory
	// limit bound one checkpoint or restore (durations; "" = 10s and 5s).
	CheckpointTimeout       string `json:"checkpoint_timeout,omitempty"`
	CheckpointTimeoutPerGiB string `json:"checkpoint_timeout_per_gib,omitempty"`
	// TrustCRIU skips runc's trial checkpoint at start: memory pauses on
	// runc are attempted (and bounded) whenever CRIU is installed.
	TrustCRIU bool `json:"trust_criu,omitempty"`
}

// Validate names the bad key.
func (c *CheckpointConfig) Validate() error {
	for k, v := range map[string]string{"checkpoint_timeout": c.CheckpointTimeout, "checkpoint_timeout_per_gib": c.CheckpointTimeoutPerGiB} {
		if v == "" {
			continue
		}
		if d, err := server.ParseDuration(v); err != nil || d <= 0 {
			return errs.Field(k, "must be a positive duration, got %q", v)
		}
	}
	return nil
}

func (c *CheckpointConfig) checkpointTimeout() time.Duration {
	d, _ := server.ParseDuration(c.CheckpointTimeout)
	return d // 0: the daemon's default
}

func (c *CheckpointConfig) checkpointTimeoutPerGiB() time.Duration {
	d, _ := server.ParseDuration(c.CheckpointTimeoutPerGiB)
	return d
}

// probeWait is how long the server's readiness waits for runc's trial
// checkpoint; past it the trial goes on in the background and whatever
// needs its verdict (a memory pause, `berth info`) waits for it.
const probeWait = 3 * time.Second

func waitProbe(done <-chan struct{}, log *slog.Logger) {
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(probeWait):
		log.Info("runc checkpoint probe still running; serving meanwhile")
	}
}

//go:build linux && !clientonly

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckpointConfig(t *testing.T) {
	for _, c := range []struct {
		json, badKey string
		base, perGiB time.Duration
		trust        bool
	}{
		{json: `{}`},
		{json: `{"checkpoint_timeout": "3s", "checkpoint_timeout_per_gib": "2s", "trust_criu": true}`, base: 3 * time.Second, perGiB: 2 * time.Second, trust: true},
		{json: `{"checkpoint_timeout": "0s"}`, badKey: "checkpoint_timeout"},
		{json: `{"checkpoint_timeout_per_gib": "soon"}`, badKey: "checkpoint_timeout_per_gib"},
		{json: `{"checkpoint_timeouts": "3s"}`, badKey: "checkpoint_timeouts"},
	} {
		t.Run(c.json, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "berth.json")
			if err := os.WriteFile(p, []byte(c.json), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := defaultServeConfig()
			err := loadConfigFile(p, &cfg)
			if err == nil {
				err = cfg.Validate()
			}
			if c.badKey != "" {
				if err == nil || !strings.Contains(err.Error(), c.badKey) {
					t.Fatalf("err = %v, want one naming %s", err, c.badKey)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.checkpointTimeout(); got != c.base {
				t.Errorf("checkpoint_timeout = %v, want %v", got, c.base)
			}
			if got := cfg.checkpointTimeoutPerGiB(); got != c.perGiB {
				t.Errorf("checkpoint_timeout_per_gib = %v, want %v", got, c.perGiB)
			}
			if cfg.TrustCRIU != c.trust {
				t.Errorf("trust_criu = %v, want %v", cfg.TrustCRIU, c.trust)
			}
		})
	}
}

//go:build linux && !clientonly

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWorkspaceSparesConfig: the flag and the config file's
// workspace_spares reach the daemon as its default (unset), none (0) or a
// count, and a negative count is refused by name.
func TestWorkspaceSparesConfig(t *testing.T) {
	for _, c := range []struct {
		name, json string
		args       []string
		want       int
		badKey     string
	}{
		{name: "unset", want: 0},
		{name: "flag none", args: []string{"--workspace-spares", "0"}, want: -1},
		{name: "flag count", args: []string{"--workspace-spares", "3"}, want: 3},
		{name: "file none", json: `{"workspace_spares": 0}`, want: -1},
		{name: "file count, flag wins", json: `{"workspace_spares": 5}`, args: []string{"--workspace-spares", "2"}, want: 2},
		{name: "file negative", json: `{"workspace_spares": -2}`, badKey: "workspace_spares"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--data-dir", filepath.Join(dir, "data")}, c.args...)
			if c.json != "" {
				p := filepath.Join(dir, "berth.json")
				if err := os.WriteFile(p, []byte(c.json), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", p)
			}
			cfg, err := parseServe("serve", args, io.Discard, nil)
			if c.badKey != "" {
				if err == nil || !strings.Contains(err.Error(), c.badKey) {
					t.Fatalf("err = %v, want one naming %s", err, c.badKey)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := daemonSpares(cfg.WorkspaceSpares); got != c.want {
				t.Errorf("daemon spares = %d, want %d", got, c.want)
			}
		})
	}
}

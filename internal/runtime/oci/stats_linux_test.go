package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

// TestStatsReadsCgroupWithoutRuntime: with the container's cgroup present,
// Stats reads it without running the runtime binary (one process per
// sandbox per reaper round does not scale to 1,000 sandboxes); without
// one, the runtime's answer (here: a failing binary) is the error.
func TestStatsReadsCgroupWithoutRuntime(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	bin := filepath.Join(dir, "fakeruntime")
	script := "#!/bin/sh\necho \"$@\" >> " + calls + "\necho 'container \"x\" does not exist' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cgroot := filepath.Join(dir, "cgroup")
	files := map[string]string{
		"cpuacct/berth/s1/cpuacct.usage":            "123456789\n",
		"memory/berth/s1/memory.usage_in_bytes":     "4096\n",
		"memory/berth/s1/memory.max_usage_in_bytes": "8192\n",
		"memory/berth/s1/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"pids/berth/s1/pids.current":                "3\n",
	}
	for p, v := range files {
		full := filepath.Join(cgroot, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o, err := New(Runc, Config{Binary: bin, Root: filepath.Join(dir, "root"), CgroupRoot: cgroot})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := o.Stats(ctx, "s1")
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if s.CPUUsageNanos != 123456789 || s.MemoryBytes != 4096 || s.MemoryPeak != 8192 || s.Pids != 3 || s.OOMKills != 2 {
		t.Errorf("Stats = %+v", s)
	}
	if n, err := o.OOMKills(ctx, "s1"); err != nil || n != 2 {
		t.Errorf("OOMKills = %d, %v; want 2", n, err)
	}
	if _, err := o.OOMKills(ctx, "gone"); err == nil {
		t.Error("OOMKills of a sandbox with no cgroup succeeded")
	}
	if b, _ := os.ReadFile(calls); len(b) != 0 {
		t.Errorf("Stats or OOMKills ran the runtime with a cgroup present: %q", b)
	}
	if _, err := o.Stats(ctx, "gone"); err == nil {
		t.Fatal("Stats of a sandbox with no cgroup succeeded")
	}
	if b, _ := os.ReadFile(calls); !strings.Contains(string(b), "state gone") {
		t.Errorf("without a cgroup, Stats did not ask the runtime: calls %q", b)
	}
	if _, err := o.Stats(ctx, "../s1"); !errs.Is(err, errs.InvalidArgument) {
		t.Errorf("Stats(../s1) = %v, want InvalidArgument", err)
	}
}

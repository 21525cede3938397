package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runtimeCaps is what `berth info` says about one runtime on this host.
type runtimeCaps struct {
	Name             string `json:"name"`
	Checkpoint       bool   `json:"checkpoint"`
	CheckpointReason string `json:"checkpoint_reason"`
}

// checkpointCaps returns the server's verdict on memory checkpoints of rt:
// for runc, the result of its trial checkpoint of a throwaway container.
func checkpointCaps(t *testing.T, s *server, rt string) runtimeCaps {
	t.Helper()
	var in struct {
		Runtimes []runtimeCaps `json:"runtimes"`
	}
	if err := json.Unmarshal([]byte(s.must("info", "--json")), &in); err != nil {
		t.Fatal(err)
	}
	for _, r := range in.Runtimes {
		if r.Name == rt {
			if !r.Checkpoint && r.CheckpointReason == "" {
				t.Fatalf("info: %s has no memory checkpoint and gives no reason", rt)
			}
			return r
		}
	}
	t.Fatalf("info lists no runtime %s", rt)
	return runtimeCaps{}
}

// wantMemoryPause checks the honest outcome of `pause --mode memory` of id
// on rt: memory where this host's server can checkpoint rt, else disk with
// the reason in the sandbox's message and a pause_degraded event. It
// returns the pause mode the resume must report.
func wantMemoryPause(t *testing.T, s *server, id, rt string) string {
	t.Helper()
	caps := checkpointCaps(t, s, rt)
	v := inspect(t, s, id)
	if v.State != "paused" || v.PauseRequested != "memory" {
		t.Fatalf("after pause --mode memory: %+v", v)
	}
	if caps.Checkpoint {
		if v.PauseActual != "memory" {
			t.Fatalf("%s can checkpoint here, but the pause is %q: %s", rt, v.PauseActual, v.Message)
		}
		return "memory"
	}
	if v.PauseActual != "disk" || !strings.Contains(v.Message, caps.CheckpointReason) {
		t.Fatalf("%s cannot checkpoint here (%s); pause: %+v, want disk with that reason", rt, caps.CheckpointReason, v)
	}
	if evs := s.must("events", id, "--json"); !strings.Contains(evs, `"pause_degraded"`) {
		t.Fatalf("no pause_degraded event:\n%s", evs)
	}
	return "disk"
}

// fakeCRIU writes a stand-in for the criu binary: "hang" never answers (its
// child sleep carries a marker, to find what a kill left behind), "fail"
// exits at once with an error.
func fakeCRIU(t *testing.T, behaviour string) (path, marker string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	marker = fmt.Sprint(800000 + binary.BigEndian.Uint32(b[:])%99999)
	body := map[string]string{
		"hang": "sleep " + marker + " &\nwait\n",
		"fail": "echo 'criu: simulated failure' >&2\nexit 1\n",
	}[behaviour]
	path = filepath.Join(t.TempDir(), "criu")
	script := []byte("#!/bin/sh\n" + body)
	if err := os.WriteFile(path, script, 0o755); err != nil {
		t.Fatal(err)
	}
	// A server on the shared cache dir caches the probe's verdict on this
	// stand-in (keyed by its hash and the trial's shape): remove it with the stand-in.
	sum := sha256.Sum256(script)
	t.Cleanup(func() {
		stale, _ := filepath.Glob("/var/cache/berth/criu-probe/*-" + hex.EncodeToString(sum[:])[:16] + "*.json")
		for _, p := range stale {
			_ = os.Remove(p)
		}
	})
	return path, marker
}

func criuLeftovers(marker string) string {
	out, _ := exec.Command("pgrep", "-af", "sleep "+marker).Output()
	return strings.TrimSpace(string(out))
}

// checkpointFaultConfig: checkpoints bounded to 2 s + 1 s per GiB, and a
// reaper policy "memidle" that pauses an idle sandbox in memory mode.
const checkpointFaultConfig = `{
  "criu_path": %q, "trust_criu": %v,
  "checkpoint_timeout": "2s", "checkpoint_timeout_per_gib": "1s",
  "reaper": {"interval": "500ms", "policies": {"memidle": {
    "client_idle": "2s", "api_idle": "2s", "write_idle": "2s", "egress_idle": "2s", "cpu_idle": "2s",
    "pause_mode": "memory", "disk_after": "1h", "archive_after": "2h"}}}
}`

// TestCheckpointFaults runs runc with a criu that hangs and one that fails.
// "probe": the trial checkpoint at start catches it, `berth info` says no
// with the reason, memory pauses are disk from the start. "trusted": the
// trial is skipped, so the real checkpoints hang or fail: each answers
// within its bound, the helper is killed, and the sandbox ends paused(disk)
// (pause), running (fork parent) or paused(disk) (reaper), every file intact.
func TestCheckpointFaults(t *testing.T) {
	for _, behaviour := range []string{"hang", "fail"} {
		for _, trusted := range []bool{false, true} {
			name := behaviour + "/probe"
			if trusted {
				name = behaviour + "/trusted"
			}
			t.Run(name, func(t *testing.T) {
				criu, marker := fakeCRIU(t, behaviour)
				cfg := filepath.Join(t.TempDir(), "berth.json")
				if err := os.WriteFile(cfg, []byte(fmt.Sprintf(checkpointFaultConfig, criu, trusted)), 0o644); err != nil {
					t.Fatal(err)
				}
				// A cache dir of its own: the verdict is the one the probe reaches now.
				t.Setenv("BERTH_CACHE_DIR", t.TempDir())
				s := startServer(t, "--config", cfg)
				checkFaultyCRIU(t, s, behaviour, trusted, marker)
			})
		}
	}
}

func checkFaultyCRIU(t *testing.T, s *server, behaviour string, trusted bool, marker string) {
	caps := checkpointCaps(t, s, "runc")
	if caps.Checkpoint != trusted {
		t.Fatalf("info: runc checkpoint = %v (%s) with a criu that %ss, trusted=%v", caps.Checkpoint, caps.CheckpointReason, behaviour, trusted)
	}
	if !trusted {
		want := map[string]string{"hang": "did not finish within", "fail": "failed"}[behaviour]
		if !strings.Contains(caps.CheckpointReason, want) {
			t.Errorf("info reason %q, want it to say %q", caps.CheckpointReason, want)
		}
	}
	why := map[string]string{"hang": "did not finish within", "fail": "memory checkpoint failed"}[behaviour]
	if !trusted {
		why = caps.CheckpointReason
	}

	t.Run("pause", func(t *testing.T) {
		id := s.create("--runtime", "runc", "--memory", "256")
		s.must("exec", "--user", "root", id, "--", "sh", "-c", "mkdir -p /home/user/d && echo kept > /home/user/d/f && echo x > /etc/written")
		start := time.Now()
		out, code := s.run("pause", id, "--mode", "memory")
		took := time.Since(start)
		t.Logf("pause answered after %v (exit %d): %s", took, code, out)
		if code != 0 {
			t.Fatalf("pause: exit %d: %s", code, out)
		}
		// Bound: 2 s + 1 s per GiB of the limit for the checkpoint, then the
		// disk pause itself; generous slack for a loaded CI machine.
		if took > 30*time.Second {
			t.Errorf("pause took %v; the checkpoint bound is 3 s", took)
		}
		v := inspect(t, s, id)
		if v.State != "paused" || v.PauseRequested != "memory" || v.PauseActual != "disk" || !strings.Contains(v.Message, why) {
			t.Fatalf("after pause: %+v, want paused/disk saying %q", v, why)
		}
		degraded := false
		for _, ev := range s.rpEvents(id) {
			if ev.To == "failed" {
				t.Errorf("the sandbox went through failed: %+v", ev)
			}
			if ev.Type == "pause_degraded" && ev.Data["requested"] == "memory" && ev.Data["actual"] == "disk" {
				degraded = true
			}
		}
		if !degraded {
			t.Errorf("no pause_degraded memory→disk event:\n%s", s.must("events", id))
		}
		if l := criuLeftovers(marker); l != "" {
			t.Errorf("the stand-in criu outlived the pause:\n%s", l)
		}
		s.must("resume", id)
		if v := inspect(t, s, id); v.State != "running" || v.ResumedFrom != "disk" {
			t.Fatalf("after resume: %+v", v)
		}
		if out := s.must("exec", id, "--", "sh", "-c", "cat /home/user/d/f /etc/written"); out != "kept\nx" {
			t.Fatalf("files after the fallback: %q", out)
		}
		s.must("rm", id)
	})

	t.Run("fork", func(t *testing.T) {
		id := s.create("--runtime", "runc", "--memory", "256")
		s.must("exec", id, "--", "sh", "-c", "echo parent > /home/user/p")
		res := s.fork(id, 1)
		if res.Mode != "disk" || res.Reason == "" {
			t.Fatalf("fork with a criu that %ss: mode %q reason %q, want a files-only fork with a reason", behaviour, res.Mode, res.Reason)
		}
		child := res.Sandboxes[0].ID
		if m := res.Sandboxes[0].Extra["fork_mode"]; m != "disk" {
			t.Errorf("child fork_mode %q, want disk", m)
		}
		if v := inspect(t, s, id); v.State != "running" {
			t.Fatalf("parent after the fork: %+v", v)
		}
		for _, sb := range []string{id, child} {
			if out := s.must("exec", sb, "--", "cat", "/home/user/p"); out != "parent" {
				t.Errorf("%s: file %q", sb, out)
			}
		}
		if evs := s.must("events", id, "--json"); strings.Contains(evs, "fork_failed") {
			t.Errorf("parent events:\n%s", evs)
		}
		if l := criuLeftovers(marker); l != "" {
			t.Errorf("the stand-in criu outlived the fork:\n%s", l)
		}
		s.must("rm", id, child)
	})

	t.Run("reaper", func(t *testing.T) {
		id := s.create("--runtime", "runc", "--memory", "256", "--idle-policy", "memidle")
		s.must("exec", id, "--", "sh", "-c", "echo idle > /home/user/i")
		rpWaitFor(t, 60*time.Second, "the reaper to pause the idle sandbox", func() bool {
			v := s.rpInspect(id)
			if v.State == "failed" {
				t.Fatalf("the reaper's pause left the sandbox failed: %+v", v)
			}
			return v.State == "paused"
		})
		if v := inspect(t, s, id); v.PauseActual != "disk" || !strings.Contains(v.Message, why) {
			t.Fatalf("reaper pause: %+v, want disk saying %q", v, why)
		}
		s.must("resume", id)
		if out := s.must("exec", id, "--", "cat", "/home/user/i"); out != "idle" {
			t.Errorf("file after the reaper's pause: %q", out)
		}
		if l := criuLeftovers(marker); l != "" {
			t.Errorf("the stand-in criu outlived the reaper's pause:\n%s", l)
		}
		s.must("rm", id)
	})
}

// TestCheckpointRealCRIU: the server's trial of this host's real CRIU
// decides, and everything agrees with it. Where it works, a memory pause
// keeps the counter process (same pid) and a fork carries memory; where it
// does not, `berth info` says why, memory pauses on runc are disk with that
// reason, a fork is files-only with the parent running, and the reaper's
// idle memory pause ends paused(disk), never failed.
func TestCheckpointRealCRIU(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "berth.json")
	if err := os.WriteFile(cfg, []byte(`{"reaper": {"interval": "500ms", "policies": {"memidle": {
    "client_idle": "2s", "api_idle": "2s", "write_idle": "2s", "egress_idle": "2s", "cpu_idle": "2s",
    "pause_mode": "memory", "disk_after": "1h", "archive_after": "2h"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--config", cfg)
	caps := checkpointCaps(t, s, "runc")
	t.Logf("runc memory checkpoint on this host: %v %s", caps.Checkpoint, caps.CheckpointReason)

	t.Run("pause", func(t *testing.T) {
		id := s.create("--runtime", "runc")
		defer s.run("rm", id)
		startCounter(t, s, id)
		pid := counterPid(s, id)
		s.must("pause", id, "--mode", "memory")
		want := wantMemoryPause(t, s, id, "runc")
		s.must("resume", id)
		if v := inspect(t, s, id); v.ResumedFrom != want {
			t.Fatalf("resumed_from %q, want %q", v.ResumedFrom, want)
		}
		got := counterPid(s, id)
		if want == "memory" && got != pid {
			t.Fatalf("counter pid %q after a memory resume, was %q", got, pid)
		}
		if want == "disk" && got != "" {
			t.Fatalf("a disk pause kept process %q", got)
		}
	})
	t.Run("fork", func(t *testing.T) {
		id := s.create("--runtime", "runc")
		defer s.run("rm", id)
		s.must("exec", id, "--", "sh", "-c", "echo parent > /home/user/p")
		res := s.fork(id, 1)
		defer s.run("rm", res.Sandboxes[0].ID)
		want := "disk"
		if caps.Checkpoint {
			want = "memory"
		}
		if res.Mode != want || (want == "disk" && !strings.Contains(res.Reason, caps.CheckpointReason)) {
			t.Fatalf("fork: mode %q reason %q, want %s", res.Mode, res.Reason, want)
		}
		if v := inspect(t, s, id); v.State != "running" {
			t.Fatalf("parent after the fork: %+v", v)
		}
		if out := s.must("exec", res.Sandboxes[0].ID, "--", "cat", "/home/user/p"); out != "parent" {
			t.Errorf("child file %q", out)
		}
	})
	t.Run("reaper", func(t *testing.T) {
		id := s.create("--runtime", "runc", "--idle-policy", "memidle")
		defer s.run("rm", id)
		rpWaitFor(t, 60*time.Second, "the reaper to pause the idle sandbox", func() bool {
			v := s.rpInspect(id)
			if v.State == "failed" {
				t.Fatalf("the reaper's pause left the sandbox failed: %+v", v)
			}
			return v.State == "paused"
		})
		wantMemoryPause(t, s, id, "runc")
	})
}

// TestRestoreFaults: a memory image whose restore hangs or fails. The
// stand-in criu passes calls to the real one until a flag file appears,
// then hangs or fails: the resume answers within its bound, boots the
// sandbox from disk with every file, and says so. Where this host's CRIU
// cannot even checkpoint, the pause is disk (the honest outcome) and there
// is no image to restore.
func TestRestoreFaults(t *testing.T) {
	const realCRIU = "/var/cache/berth/bin/criu"
	if _, err := os.Stat(realCRIU); err != nil {
		t.Fatalf("criu not built at %s (scripts/build-criu.sh): %v", realCRIU, err)
	}
	for _, behaviour := range []string{"hang", "fail"} {
		t.Run(behaviour, func(t *testing.T) {
			dir := t.TempDir()
			flag := filepath.Join(dir, "broken")
			var b [4]byte
			_, _ = rand.Read(b[:])
			marker := fmt.Sprint(700000 + binary.BigEndian.Uint32(b[:])%99999)
			broken := map[string]string{"hang": "sleep " + marker + " &\n\twait", "fail": "echo 'criu: simulated restore failure' >&2\n\texit 1"}[behaviour]
			criu := filepath.Join(dir, "criu")
			script := fmt.Sprintf("#!/bin/sh\nif [ -e %s ]; then\n\t%s\nfi\nexec %s \"$@\"\n", flag, broken, realCRIU)
			if err := os.WriteFile(criu, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "berth.json")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"criu_path": %q, "trust_criu": true, "checkpoint_timeout": "2s", "checkpoint_timeout_per_gib": "1s"}`, criu)), 0o644); err != nil {
				t.Fatal(err)
			}
			s := startServer(t, "--config", cfg)
			id := s.create("--runtime", "runc", "--memory", "256")
			s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
			s.must("pause", id, "--mode", "memory")
			v := inspect(t, s, id)
			if v.PauseActual != "memory" {
				// This host's CRIU cannot checkpoint within the bound: disk, said so.
				if v.State != "paused" || v.PauseActual != "disk" || !strings.Contains(v.Message, "memory checkpoint") {
					t.Fatalf("pause: %+v", v)
				}
				t.Logf("this host's CRIU did not checkpoint (%s); no image to restore", v.Message)
			} else if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			s.must("resume", id)
			t.Logf("resume answered after %v", time.Since(start))
			v = inspect(t, s, id)
			if v.State != "running" || v.ResumedFrom != "disk" {
				t.Fatalf("after resume: %+v", v)
			}
			if _, err := os.Stat(flag); err == nil {
				want := map[string]string{"hang": "restore did not finish within", "fail": "memory restore failed"}[behaviour]
				if !strings.Contains(v.Message, want) {
					t.Errorf("resume message %q, want it to say %q", v.Message, want)
				}
				if evs := s.must("events", id, "--json"); !strings.Contains(evs, `"resume_degraded"`) {
					t.Errorf("no resume_degraded event:\n%s", evs)
				}
			}
			if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
				t.Fatalf("file after the fallback: %q", out)
			}
			if l := criuLeftovers(marker); l != "" {
				t.Errorf("the stand-in criu outlived the resume:\n%s", l)
			}
		})
	}
}

// TestFailedSaysHowToRecover: a sandbox whose processes die is failed, but
// its workspace is intact: inspect, events and a refused resume say that
// `berth start` brings it back, and it does, with its files.
func TestFailedSaysHowToRecover(t *testing.T) {
	s := startServer(t)
	id := s.create()
	s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
	if out, err := exec.Command("runc", "--root", filepath.Join(s.dataDir, "runtime", "runc"), "kill", id, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	waitState(t, s, id, "failed", 30*time.Second)
	hint := "berth start " + id
	if v := inspect(t, s, id); !strings.Contains(v.Message, hint) {
		t.Errorf("failed sandbox message %q does not say %q", v.Message, hint)
	}
	if evs := s.must("events", id); !strings.Contains(evs, hint) {
		t.Errorf("events do not say %q:\n%s", hint, evs)
	}
	out, code := s.run("resume", id)
	if code != 4 || !strings.Contains(out, hint) {
		t.Errorf("resume of a failed sandbox: exit %d: %s; want 4 naming %q", code, out, hint)
	}
	s.must("start", id)
	if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
		t.Fatalf("file after berth start: %q", out)
	}
}

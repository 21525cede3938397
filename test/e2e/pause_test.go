package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testutil"
)

// counterScript records its own pid (its forked children, a subshell before
// exec, would otherwise show up in ps as count.sh too).
const counterScript = "echo $$ > /tmp/counter.pid\ni=0\nwhile true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done\n"

// startCounter runs a process that keeps a counter in memory and mirrors it to /tmp/counter.
func startCounter(t *testing.T, s *server, id string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "count.sh")
	if err := os.WriteFile(p, []byte(counterScript), 0o644); err != nil {
		t.Fatal(err)
	}
	s.must("cp", p, id+":/home/user/count.sh")
	s.must("exec", id, "--", "sh", "-c", "sh /home/user/count.sh >/dev/null 2>&1 &")
	waitCounter(t, s, id, 1)
	if counterPid(s, id) == "" {
		t.Fatal("the counter runs but counterPid does not find it")
	}
}

// counter reads /tmp/counter; -1 when it is missing.
func counter(s *server, id string) int {
	out, code := s.run("exec", id, "--", "cat", "/tmp/counter")
	if code != 0 {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return -1
	}
	return n
}

func waitCounter(t *testing.T, s *server, id string, atLeast int) int {
	t.Helper()
	n := -1
	testutil.Eventually(t, testutil.Within(10*time.Second).Every(50*time.Millisecond), func() error {
		if n = counter(s, id); n >= atLeast {
			return nil
		}
		return fmt.Errorf("counter in %s never reached %d (last read %d)", id, atLeast, n)
	})
	return n
}

func counterPid(s *server, id string) string {
	out, _, _ := s.runSplit(s.key, nil, "exec", id, "--", "sh", "-c",
		`p=$(cat /tmp/counter.pid 2>/dev/null) && [ "$(tr '\000' ' ' </proc/$p/cmdline 2>/dev/null)" = "sh /home/user/count.sh " ] && echo $p`)
	return strings.TrimSpace(out)
}

type pauseView struct {
	ID             string `json:"id"`
	State          string `json:"state"`
	PauseRequested string `json:"pause_mode_requested"`
	PauseActual    string `json:"pause_mode"`
	ResumedFrom    string `json:"resumed_from"`
	RestoreCount   int    `json:"restore_count"`
	Message        string `json:"message"`
}

func inspect(t *testing.T, s *server, id string) pauseView {
	t.Helper()
	var v pauseView
	if err := json.Unmarshal([]byte(s.must("inspect", id)), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPauseModes: every mode on both runtimes keeps files; freeze and memory
// keep processes running where they were, disk boots again.
func TestPauseModes(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, rt := range []string{"runc", "runsc"} {
		for _, mode := range []string{"freeze", "memory", "disk"} {
			t.Run(rt+"/"+mode, func(t *testing.T) {
				id := s.create("--runtime", rt)
				defer s.run("rm", id)
				startCounter(t, s, id)
				pid := counterPid(s, id)
				s.must("exec", id, "--", "sh", "-c", "echo "+mode+" > /home/user/before")
				s.must("pause", id, "--mode", mode)
				v := inspect(t, s, id)
				want := mode // what this host honestly gives: memory only where rt can checkpoint
				if mode == "memory" {
					want = wantMemoryPause(t, s, id, rt)
				}
				if v.State != "paused" || v.PauseActual != want || v.PauseRequested != mode {
					t.Fatalf("after pause: %+v", v)
				}
				if _, code := s.run("exec", id, "--", "true"); code == 0 {
					t.Fatal("exec into a paused sandbox (no auto-resume) succeeded")
				}
				s.must("resume", id)
				v = inspect(t, s, id)
				if v.State != "running" || v.ResumedFrom != want {
					t.Fatalf("after resume: %+v", v)
				}
				if out := s.must("exec", id, "--", "cat", "/home/user/before"); out != mode {
					t.Fatalf("file written before pause: %q", out)
				}
				switch want {
				case "freeze", "memory":
					if got := counterPid(s, id); got != pid {
						t.Fatalf("counter process %q after resume, was %q: it was restarted", got, pid)
					}
					n := counter(s, id)
					waitCounter(t, s, id, n+2)
					if mode == "memory" {
						if v.RestoreCount != 1 {
							t.Errorf("restore_count %d, want 1", v.RestoreCount)
						}
						if out := s.must("exec", id, "--", "sh", "-c", "echo $BERTH_RESTORE_COUNT"); out != "1" {
							t.Errorf("BERTH_RESTORE_COUNT=%q", out)
						}
					}
				case "disk":
					if got := counterPid(s, id); got != "" {
						t.Fatalf("a disk pause kept process %q", got)
					}
				}
			})
		}
	}
}

// TestPauseCycles: ten pause/resume cycles in a row in each mode, with
// writes between them, lose nothing.
func TestPauseCycles(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	for _, c := range []struct{ rt, mode string }{{"runsc", "memory"}, {"runc", "memory"}, {"runc", "freeze"}, {"runc", "disk"}} {
		t.Run(c.rt+"/"+c.mode, func(t *testing.T) {
			id := s.create("--runtime", c.rt)
			defer s.run("rm", id)
			want := c.mode
			if c.mode == "memory" && !checkpointCaps(t, s, c.rt).Checkpoint {
				want = "disk" // the honest outcome where rt cannot checkpoint here
			}
			for i := 0; i < 10; i++ {
				s.must("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d >> /home/user/log", i))
				s.must("pause", id, "--mode", c.mode)
				if i == 0 && c.mode == "memory" {
					wantMemoryPause(t, s, id, c.rt)
				}
				if v := inspect(t, s, id); v.PauseActual != want {
					t.Fatalf("cycle %d: paused as %q (%s), want %s", i, v.PauseActual, v.Message, want)
				}
				s.must("resume", id)
			}
			out := s.must("exec", id, "--", "cat", "/home/user/log")
			if want := "0\n1\n2\n3\n4\n5\n6\n7\n8\n9"; out != want {
				t.Fatalf("log after 10 cycles:\n%s", out)
			}
		})
	}
}

// TestPauseDegradesHonestly forces a memory pause that cannot be taken (no
// CRIU) and checks the fallback to disk is recorded, not silent.
func TestPauseDegradesHonestly(t *testing.T) {
	t.Setenv("BERTH_CRIU", "/nonexistent/criu")
	s := startServer(t)
	id := s.create("--runtime", "runc")
	s.must("exec", id, "--", "sh", "-c", "echo kept > /home/user/f")
	s.must("pause", id, "--mode", "memory")
	v := inspect(t, s, id)
	if v.State != "paused" || v.PauseRequested != "memory" || v.PauseActual != "disk" || v.Message == "" {
		t.Fatalf("degraded pause: %+v", v)
	}
	evs := s.must("events", id, "--json")
	if !strings.Contains(evs, `"pause_degraded"`) || !strings.Contains(evs, "fallback_to_disk") {
		t.Fatalf("no pause_degraded event:\n%s", evs)
	}
	s.must("resume", id)
	if v := inspect(t, s, id); v.ResumedFrom != "disk" {
		t.Fatalf("resumed_from %q, want disk", v.ResumedFrom)
	}
	if out := s.must("exec", id, "--", "cat", "/home/user/f"); out != "kept" {
		t.Fatalf("file after degraded pause: %q", out)
	}
}

// TestPausedSurvivesDaemonRestart: paused sandboxes of every mode are still
// paused after a kill -9 of the daemon, and resume.
func TestPausedSurvivesDaemonRestart(t *testing.T) {
	requireRunsc(t)
	s := startServer(t)
	ids := map[string]string{}
	for _, c := range []struct{ rt, mode string }{{"runsc", "memory"}, {"runc", "freeze"}, {"runc", "disk"}} {
		id := s.create("--runtime", c.rt)
		startCounter(t, s, id)
		s.must("exec", id, "--", "sh", "-c", "echo "+c.mode+" > /home/user/m")
		s.must("pause", id, "--mode", c.mode)
		ids[id] = c.mode
	}
	s.kill9()
	s.start()
	for id, mode := range ids {
		if v := inspect(t, s, id); v.State != "paused" || v.PauseActual != mode {
			t.Fatalf("%s after restart: %+v, want paused/%s", id, v, mode)
		}
		s.must("resume", id)
		if out := s.must("exec", id, "--", "cat", "/home/user/m"); out != mode {
			t.Fatalf("%s file: %q", id, out)
		}
		if mode != "disk" {
			n := counter(s, id)
			waitCounter(t, s, id, n+2)
		}
	}
}

func TestPauseConflictsAndStreams(t *testing.T) {
	s := startServer(t)
	id := s.create()

	t.Run("pause during an exec stream ends it with a clear error", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			out, _ := s.run("exec", id, "--", "sleep", "30")
			done <- out
		}()
		// Pause only once the stream's process runs.
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, body := s.apiList(s.key, "GET", "/v1/sandboxes/"+id+"/processes")
			if strings.Contains(body, "sleep") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the exec'd sleep never showed up in the process list")
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.must("pause", id, "--mode", "freeze")
		select {
		case out := <-done:
			if !strings.Contains(out, "sandbox paused") {
				t.Fatalf("stream ended with %q, want 'sandbox paused'", out)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("exec stream still open after pause")
		}
	})
	t.Run("pause twice is a conflict naming the state", func(t *testing.T) {
		out, code := s.run("pause", id)
		if code != 4 || !strings.Contains(out, "paused") {
			t.Fatalf("second pause: exit %d: %s", code, out)
		}
		code2, body := s.api(s.key, "POST", "/v1/sandboxes/"+id+"/pause", map[string]string{})
		if code2 != 409 || !strings.Contains(fmt.Sprint(body["message"]), "paused") {
			t.Fatalf("API second pause: %d %v", code2, body)
		}
		s.must("resume", id)
		if _, code := s.run("resume", id); code != 4 {
			t.Fatalf("resume of a running sandbox: exit %d, want 4", code)
		}
	})
	t.Run("concurrent pause and resume are serialised", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := 0; i < 6; i++ {
			wg.Add(2)
			go func() { defer wg.Done(); s.run("pause", id, "--mode", "freeze") }()
			go func() { defer wg.Done(); s.run("resume", id) }()
		}
		wg.Wait()
		if v := inspect(t, s, id); v.State == "paused" {
			s.must("resume", id)
		}
		if out := s.must("exec", id, "--", "echo", "fine"); out != "fine" {
			t.Fatalf("after concurrent pause/resume: %q", out)
		}
	})
}

func TestExpiryLeaseAndAutoResume(t *testing.T) {
	s := startServer(t)
	// The expiry pause is a memory pause where the runtime can checkpoint
	// here, else disk (with the reason); never stuck in pausing, never failed.
	wantExpiryPause := func(t *testing.T, id string) {
		t.Helper()
		waitState(t, s, id, "paused", 30*time.Second)
		v := inspect(t, s, id)
		rt := "runc"
		if err := json.Unmarshal([]byte(s.must("inspect", id)), &struct {
			Runtime *string `json:"runtime"`
		}{&rt}); err != nil {
			t.Fatal(err)
		}
		caps := checkpointCaps(t, s, rt)
		if want := map[bool]string{true: "memory", false: "disk"}[caps.Checkpoint]; v.PauseActual != want {
			t.Fatalf("expiry pause on %s: %+v, want %s (%s)", rt, v, want, caps.CheckpointReason)
		}
	}
	t.Run("expiry action pause", func(t *testing.T) {
		id := s.create("--ttl", "2s", "--expiry-action", "pause")
		wantExpiryPause(t, id)
		s.must("extend", id, "--ttl", "10m")
		s.must("resume", id)
	})
	t.Run("workstation defaults to pause at expiry", func(t *testing.T) {
		id := s.create("--ttl", "2s", "--workstation")
		wantExpiryPause(t, id)
	})
	t.Run("a lease keeps a sandbox from expiring", func(t *testing.T) {
		id := s.create("--ttl", "2s")
		s.must("lease", id, "--for", "1m")
		time.Sleep(4 * time.Second)
		if v := inspect(t, s, id); v.State != "running" {
			t.Fatalf("leased sandbox is %s", v.State)
		}
		s.must("lease", id, "--for", "0")
		waitState(t, s, id, "stopped", 15*time.Second)
		evs := s.must("events", id, "--json")
		if !strings.Contains(evs, "lease_acquired") || !strings.Contains(evs, "lease_released") {
			t.Fatalf("lease events missing:\n%s", evs)
		}
	})
	t.Run("auto-resume on exec and files", func(t *testing.T) {
		id := s.create("--auto-resume")
		s.must("exec", id, "--", "sh", "-c", "echo auto > /home/user/a")
		s.must("pause", id, "--mode", "disk")
		if out := s.must("exec", id, "--", "cat", "/home/user/a"); out != "auto" {
			t.Fatalf("auto-resumed exec: %q", out)
		}
		s.must("pause", id, "--mode", "freeze")
		if out := s.must("cp", id+":/home/user/a", "-"); out != "auto" {
			t.Fatalf("auto-resumed cp: %q", out)
		}
		if v := inspect(t, s, id); v.State != "running" {
			t.Fatalf("state %s after auto-resume", v.State)
		}
	})
}

// requireRunsc checks for runsc where the set-up installs it (or on PATH).
func requireRunsc(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/var/cache/berth/bin/runsc"); err == nil {
		return
	}
	testutil.RequireTool(t, "runsc")
}

// apiList is api for endpoints that answer a JSON array: the raw body.
func (s *server) apiList(key, method, path string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitState(t *testing.T, s *server, id, want string, limit time.Duration) {
	t.Helper()
	testutil.Eventually(t, testutil.Within(limit).Every(200*time.Millisecond), func() error {
		if v := inspect(t, s, id); v.State != want {
			return fmt.Errorf("%s is %s after %s, want %s", id, v.State, limit, want)
		}
		return nil
	})
}

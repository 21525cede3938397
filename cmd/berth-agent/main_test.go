package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
	"github.com/google/go-cmp/cmp"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startAgent runs the static binary as a child subreaper on a temp socket.
func startAgent(t *testing.T) (*exec.Cmd, *agentapi.Client, string) {
	t.Helper()
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinaries(t), "berth-agent")
	run, err := os.MkdirTemp("", "berth-agent-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	key := make([]byte, agentapi.KeySize)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	ch, err := agentapi.Listen(filepath.Join(run, agentapi.SocketName), "e2esb", key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	cmd := exec.Command(bin, "--run-dir", run, "--state-dir", run, "--hook-dir", filepath.Join(run, "hooks"), "--subreaper",
		"--api-socket", filepath.Join(run, "api", "api.sock"))
	cmd.Env = append(os.Environ(), "BERTH_SANDBOX_ID=e2esb", "BERTH_AGENT_KEY="+hex.EncodeToString(key))
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	c := ch.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx, 50*time.Millisecond); err != nil {
		t.Fatalf("agent not ready: %v\n%s", err, logs.String())
	}
	return cmd, c, run
}

func run(t *testing.T, c *agentapi.Client, req agentapi.ExecRequest) (string, agentapi.Event) {
	t.Helper()
	s, err := c.Exec(context.Background(), req, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("stream ended without exit")
		}
		if err != nil {
			t.Fatal(err)
		}
		out.Write(ev.Data)
		if ev.Type == "exit" {
			ev.Pid = 0
			return out.String(), ev
		}
	}
}

// TestBinaryExecAndReaping: statuses reach their owners while the agent
// reaps every child with wait4(-1), and orphans do not stay zombies.
func TestBinaryExecAndReaping(t *testing.T) {
	cmd, c, _ := startAgent(t)
	tests := []struct {
		name     string
		shell    string
		wantOut  string
		wantExit agentapi.Event
	}{
		{"sandbox id", "echo $BERTH_SANDBOX_ID", "e2esb\n", agentapi.Event{Type: "exit", Exited: true, Status: "exit status 0"}},
		{"channel key not inherited", "echo ${BERTH_AGENT_KEY:-none}", "none\n", agentapi.Event{Type: "exit", Exited: true, Status: "exit status 0"}},
		{"exit 7", "exit 7", "", agentapi.Event{Type: "exit", ExitCode: 7, Exited: true, Status: "exit status 7", Error: "exit status 7"}},
		{"sigkill", "kill -KILL $$", "", agentapi.Event{Type: "exit", ExitCode: -1, Signal: "killed", Status: "signal: killed", Error: "signal: killed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, exit := run(t, c, agentapi.ExecRequest{Shell: tt.shell})
			if d := cmp.Diff(tt.wantExit, exit); d != "" || out != tt.wantOut {
				t.Fatalf("out %q; exit (-want +got):\n%s", out, d)
			}
		})
	}
	// The shell exits at once; its background sleep is orphaned onto the agent.
	out, _ := run(t, c, agentapi.ExecRequest{Shell: "sleep 0.5 >/dev/null 2>&1 & echo $!"})
	orphan, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("orphan pid %q", out)
	}
	// While it lives its parent is the agent (the subreaper), so only the
	// agent's wait4(-1) loop can keep it from staying a zombie.
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat"); err == nil {
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if ppid, _ := strconv.Atoi(fields[1]); ppid != cmd.Process.Pid {
			t.Fatalf("orphan %d parent = %d, want the agent %d", orphan, ppid, cmd.Process.Pid)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat")
		if err != nil {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped: %s", orphan, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBinaryQuiesce: SIGUSR1 closes the channel and ends streams while the
// process keeps running; SIGUSR2 serves again and attach finds the process.
func TestBinaryQuiesce(t *testing.T) {
	cmd, c, _ := startAgent(t)
	ctx := context.Background()
	s, err := c.Exec(ctx, agentapi.ExecRequest{Shell: "while :; do echo tick; sleep 0.05; done"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := s.Next()
		if err != nil {
			if !errs.Is(err, errs.Unavailable) {
				t.Fatalf("stream cut by quiesce: %v, want unavailable", err)
			}
			break
		}
		if ev.Type == "exit" {
			t.Fatalf("process exited on quiesce: %+v", ev)
		}
	}
	if _, err := c.Health(ctx); !errs.Is(err, errs.Unavailable) {
		t.Fatalf("health while quiesced = %v, want unavailable", err)
	}
	if err := syscall.Kill(start.Pid, 0); err != nil {
		t.Fatalf("process gone while quiesced: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(wctx, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	a, err := c.Attach(ctx, start.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if ev, err := a.Next(); err != nil || ev.Type != "start" || ev.Pid != start.Pid {
		t.Fatalf("attach start = %+v, %v", ev, err)
	}
	if ev, err := a.Next(); err != nil || string(ev.Data) != "tick\n" {
		t.Fatalf("attach output = %+v, %v", ev, err)
	}
	if err := c.Signal(ctx, start.Pid, 9); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == "exit" {
			if ev.Status != "signal: killed" {
				t.Fatalf("exit = %+v", ev)
			}
			break
		}
	}
	// SIGTERM ends the agent cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
}

// TestBinaryRestored runs the on-restore hooks through the PID-1 reaper.
func TestBinaryRestored(t *testing.T) {
	_, c, run := startAgent(t)
	hooks := filepath.Join(run, "hooks")
	if err := os.MkdirAll(hooks, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hooks, "10-hello"), []byte("#!/bin/sh\necho hello $BERTH_RESTORE_COUNT\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Restored(context.Background(), agentapi.RestoredRequest{RestoreCount: 1, HostTime: time.Now()}); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(filepath.Join(run, "on-restore.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "hello 1\n== 10-hello: exit status 2\n") {
		t.Fatalf("hook log:\n%s", log)
	}
}

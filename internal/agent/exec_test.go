package agent_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestExecResults(t *testing.T) {
	e := newEnv(t)
	mustMkdir(t, filepath.Join(e.home, "sub"))
	writeFile(t, e.cfg.EnvFile, `{"A":"file","B":"file","PATH":"/custom:/usr/bin:/bin"}`)
	tests := []struct {
		name string
		req  agentapi.ExecRequest
		want result
	}{
		{"exit 0", agentapi.ExecRequest{Shell: "echo hi"}, result{Stdout: "hi\n", Exit: ok0()}},
		{"exit 3 with stderr", agentapi.ExecRequest{Shell: "echo oops >&2; exit 3"}, result{Stderr: "oops\n",
			Exit: agentapi.Event{Type: "exit", ExitCode: 3, Exited: true, Status: "exit status 3", Error: "exit status 3"}}},
		{"sigkill", agentapi.ExecRequest{Shell: "kill -9 $$"}, result{
			Exit: agentapi.Event{Type: "exit", ExitCode: -1, Signal: "killed", Status: "signal: killed", Error: "signal: killed"}}},
		{"timeout", agentapi.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutMs: 200}, result{
			Exit: agentapi.Event{Type: "exit", ExitCode: -1, Signal: "killed", Status: "signal: killed", Error: "timeout"}}},
		{"argv from PATH", agentapi.ExecRequest{Argv: []string{"printf", "%s|", "a b", "c"}}, result{Stdout: "a b|c|", Exit: ok0()}},
		{"login shell", agentapi.ExecRequest{Shell: "echo $0", Login: true}, result{Stdout: "/bin/bash\n", Exit: ok0()}},
		{"env precedence", agentapi.ExecRequest{Shell: `echo "$A $B $HOME $USER $LOGNAME $PATH $BERTH_SANDBOX_ID ${BERTH_RESTORE_COUNT-unset}"`,
			Env: map[string]string{"B": "req"}},
			result{Stdout: "file req " + e.home + " user user /custom:/usr/bin:/bin sbtest1 unset\n", Exit: ok0()}},
		{"request env overrides HOME", agentapi.ExecRequest{Shell: "echo $HOME", Env: map[string]string{"HOME": "/x"}},
			result{Stdout: "/x\n", Exit: ok0()}},
		{"default cwd is home", agentapi.ExecRequest{Argv: []string{"pwd"}}, result{Stdout: e.home + "\n", Exit: ok0()}},
		{"relative cwd joins home", agentapi.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"}, result{Stdout: e.home + "/sub\n", Exit: ok0()}},
		{"tilde cwd", agentapi.ExecRequest{Argv: []string{"pwd"}, Cwd: "~/sub"}, result{Stdout: e.home + "/sub\n", Exit: ok0()}},
		{"default user with groups", agentapi.ExecRequest{Shell: "id -u; id -g; id -G"}, result{Stdout: "65534\n65534\n65534 4242\n", Exit: ok0()}},
		{"root user", agentapi.ExecRequest{Shell: "id -u; echo $HOME", User: "root"}, result{Stdout: "0\n/root\n", Exit: ok0()}},
		{"stdin is /dev/null", agentapi.ExecRequest{Argv: []string{"cat"}}, result{Exit: ok0()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.run(tt.req)
			if got.Phases == nil || got.Phases.SpawnUs <= 0 {
				t.Errorf("exit event of an exec: phases %+v, want the spawn's at least", got.Phases)
			}
			got.Phases = nil
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestExecRejects(t *testing.T) {
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "afile"), "x")
	tests := []struct {
		name  string
		req   agentapi.ExecRequest
		kind  errs.Kind
		words string
	}{
		{"missing cwd", agentapi.ExecRequest{Argv: []string{"true"}, Cwd: "/nonexistent/dir"}, errs.InvalidArgument, "cwd"},
		{"cwd is a file", agentapi.ExecRequest{Argv: []string{"true"}, Cwd: "afile"}, errs.InvalidArgument, "cwd"},
		{"unknown user", agentapi.ExecRequest{Argv: []string{"true"}, User: "mallory"}, errs.Unauthenticated, "unknown user"},
		{"no command", agentapi.ExecRequest{}, errs.InvalidArgument, "argv"},
		{"not on PATH", agentapi.ExecRequest{Argv: []string{"no-such-cmd-xyz"}}, errs.InvalidArgument, "argv"},
		{"negative timeout", agentapi.ExecRequest{Argv: []string{"true"}, TimeoutMs: -1}, errs.InvalidArgument, "timeout_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.Exec(testCtx(t), tt.req, 0)
			wantErr(t, err, tt.kind, tt.words)
		})
	}
}

// TestExecLargeOutput pushes 10 MiB of multibyte text through the stream;
// chunk boundaries split characters, the bytes must still arrive intact.
func TestExecLargeOutput(t *testing.T) {
	e := newEnv(t)
	line := []byte("héllo wörld ✓ 日本語 🚀\n")
	want := bytes.Repeat(line, (10<<20)/len(line)+1)
	if _, err := e.client.WriteFile(testCtx(t), "big.txt", "", 0, bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	got := e.run(agentapi.ExecRequest{Shell: "cat big.txt; cat big.txt >&2"})
	if sha256.Sum256([]byte(got.Stdout)) != sha256.Sum256(want) || got.Stderr != got.Stdout {
		t.Fatalf("output differs: stdout %d bytes, stderr %d bytes, want %d", len(got.Stdout), len(got.Stderr), len(want))
	}
	if d := cmp.Diff(ok0(), got.Exit); d != "" {
		t.Fatal(d)
	}
}

func TestExecStdin(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	s, err := e.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"cat"}, Stdin: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil || start.Type != "start" || start.Pid <= 0 {
		t.Fatalf("start = %+v, %v", start, err)
	}
	for _, chunk := range []string{"hello ", "world\n"} {
		if err := e.client.Input(ctx, start.Pid, []byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.client.CloseStdin(ctx, start.Pid); err != nil {
		t.Fatal(err)
	}
	got := collectRest(t, s)
	got.Phases = nil
	if d := cmp.Diff(result{Stdout: "hello world\n", Exit: ok0()}, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	wantErr(t, e.client.Input(ctx, start.Pid, []byte("late")), errs.NotFound, "exited")
}

// collectRest reads a stream whose start event was already consumed.
func collectRest(t *testing.T, s *agentapi.Stream) result {
	t.Helper()
	var r result
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			s.Close()
			return r
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		switch ev.Type {
		case "stdout":
			r.Stdout += string(ev.Data)
		case "stderr":
			r.Stderr += string(ev.Data)
		case "pty":
			r.PTY += string(ev.Data)
		case "exit":
			ev.Pid = 0
			r.Phases = s.Phases()
			r.Exit = ev
		}
	}
}

// nextOutput waits for an output event containing substr.
func nextOutput(t *testing.T, s *agentapi.Stream, substr string) string {
	t.Helper()
	var seen string
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("waiting for %q (seen %q): %v", substr, seen, err)
		}
		seen += string(ev.Data)
		if strings.Contains(seen, substr) {
			return seen
		}
	}
}

func TestBackgroundAttachKill(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	s, err := e.client.Exec(ctx, agentapi.ExecRequest{Shell: "echo started; while :; do echo tick; sleep 0.05; done", Tag: "bg"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	pid := start.Pid
	nextOutput(t, s, "started")
	s.Close() // the client goes away; the process must keep running

	time.Sleep(100 * time.Millisecond)
	list, err := e.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Pid != pid || list[0].Tag != "bg" || list[0].User != "user" ||
		!cmp.Equal(list[0].Argv, []string{"/bin/sh", "-c", "echo started; while :; do echo tick; sleep 0.05; done"}) {
		t.Fatalf("processes = %+v", list)
	}
	a, err := e.client.Attach(ctx, pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.Next()
	if err != nil || first.Type != "start" || first.Pid != pid {
		t.Fatalf("attach start = %+v, %v", first, err)
	}
	if out := nextOutput(t, a, "tick"); strings.Contains(out, "started") {
		t.Fatalf("attach replayed old output: %q", out)
	}
	if err := e.client.Signal(ctx, pid, 9); err != nil {
		t.Fatal(err)
	}
	got := collectRest(t, a)
	want := agentapi.Event{Type: "exit", ExitCode: -1, Signal: "killed", Status: "signal: killed", Error: "signal: killed"}
	if d := cmp.Diff(want, got.Exit); d != "" {
		t.Fatalf("exit (-want +got):\n%s", d)
	}
	if got.Phases != nil {
		t.Fatalf("an attach stream's exit carries phases %+v: only the exec's own stream has them", got.Phases)
	}
	// After exit: not listed, attach still gives start+exit, signals are NotFound.
	list, err = e.client.Processes(ctx)
	if err != nil || len(list) != 0 {
		t.Fatalf("processes after exit = %+v, %v", list, err)
	}
	a, err = e.client.Attach(ctx, pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := collect(t, a); !cmp.Equal(want, got.Exit) {
		t.Fatalf("attach after exit = %+v", got)
	}
	wantErr(t, e.client.Signal(ctx, pid, 15), errs.NotFound, strconv.Itoa(pid))
	_, err = e.client.Attach(ctx, 999999, 0)
	wantErr(t, err, errs.NotFound, "999999")
	wantErr(t, e.client.Signal(ctx, 999999, 9), errs.NotFound, "999999")
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t)
	s, err := e.client.Exec(testCtx(t), agentapi.ExecRequest{Shell: "sleep 1.5; echo done"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
	}
	if d := cmp.Diff([]string{"start", "keepalive", "stdout", "exit"}, types); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
}

func TestPTY(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	s, err := e.client.Exec(ctx, agentapi.ExecRequest{
		Shell: `stty size; echo "term=$TERM"; read line; stty size; echo "got=$line"`,
		TTY:   &agentapi.TTYSize{Cols: 80, Rows: 24},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	nextOutput(t, s, "term=xterm-256color")
	if err := e.client.Resize(ctx, start.Pid, 100, 30); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Input(ctx, start.Pid, []byte("typed\n")); err != nil {
		t.Fatal(err)
	}
	rest := collectRest(t, s)
	if !strings.Contains(rest.PTY, "30 100\r\n") || !strings.Contains(rest.PTY, "got=typed\r\n") {
		t.Fatalf("pty output after resize = %q", rest.PTY)
	}
	if d := cmp.Diff(ok0(), rest.Exit); d != "" {
		t.Fatal(d)
	}

	// A PTY's "close stdin" is EOF (^D) to the terminal's reader.
	s, err = e.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"cat"}, TTY: &agentapi.TTYSize{Cols: 80, Rows: 24}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start, err = s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.CloseStdin(ctx, start.Pid); err != nil {
		t.Fatal(err)
	}
	if got := collectRest(t, s); !cmp.Equal(ok0(), got.Exit) {
		t.Fatalf("cat on pty after ^D: %+v", got)
	}
	// Resizing a process without a terminal is a precondition failure.
	s, err = e.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sleep", "10"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, err = s.Next()
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.client.Resize(ctx, start.Pid, 10, 10), errs.FailedPrecondition, "terminal")
	wantErr(t, e.client.Input(ctx, start.Pid, []byte("x")), errs.FailedPrecondition, "stdin")
	if err := e.client.Signal(ctx, start.Pid, 15); err != nil {
		t.Fatal(err)
	}
	want := agentapi.Event{Type: "exit", ExitCode: -1, Signal: "terminated", Status: "signal: terminated", Error: "signal: terminated"}
	if got := collectRest(t, s); !cmp.Equal(want, got.Exit) {
		t.Fatalf("after SIGTERM: %+v", got)
	}
}

// TestExecOwnsNoFiles checks a process started as the user can write in its
// home (it really runs with the user's identity) and not in root's places.
func TestExecIdentity(t *testing.T) {
	e := newEnv(t)
	secret := filepath.Join(e.dir, "secret")
	if err := os.WriteFile(secret, []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := e.run(agentapi.ExecRequest{Shell: "touch mine && stat -c %u mine; cat " + secret + " 2>/dev/null || echo denied"})
	got.Phases = nil
	if d := cmp.Diff(result{Stdout: "65534\ndenied\n", Exit: ok0()}, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

// TestExecInheritsOnlyStdio: a process gets fds 0-2 and nothing of the
// agent's (its channel connections, the pipes of other processes, the
// other ends of its own pipes): the spawn path's plain fds are
// close-on-exec too. Fds this test process itself inherited without
// close-on-exec (from whoever ran go test) are passed on, as before.
func TestExecInheritsOnlyStdio(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	want := map[string]bool{"0": true, "1": true, "2": true}
	for fd := range fdSet(t, "self") {
		b, err := os.ReadFile("/proc/self/fdinfo/" + fd)
		if err != nil {
			continue // the directory's own fd, gone already
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				if flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && flags&syscall.O_CLOEXEC == 0 {
					want[fd] = true
				}
			}
		}
	}
	for _, stdin := range []bool{false, true} {
		// Two at once: the first one's fds exist while the second starts.
		var pids []int
		for range 2 {
			s, err := e.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sleep", "30"}, Stdin: stdin}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			start, err := s.Next()
			if err != nil || start.Type != "start" {
				t.Fatalf("start = %+v, %v", start, err)
			}
			pids = append(pids, start.Pid)
		}
		for _, pid := range pids {
			waitAsleep(t, pid)
			got := fdSet(t, strconv.Itoa(pid))
			if !maps.Equal(got, want) {
				t.Errorf("stdin %v: fds of pid %d = %v, want %v", stdin, pid, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
			}
			_ = e.client.Signal(ctx, pid, 9)
		}
	}
}

// waitAsleep waits until pid is blocked in sleep's own syscall: before it,
// the dynamic loader and setlocale hold fds of their own (libc.so.6 as fd 3
// was seen), which are not inherited and would read as a leak.
func waitAsleep(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if nr, err := strconv.Atoi(f[0]); err == nil && (nr == unix.SYS_CLOCK_NANOSLEEP || nr == unix.SYS_NANOSLEEP) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d is not in its sleep after 10s: syscall %q", pid, b)
		}
		time.Sleep(time.Millisecond)
	}
}

// fdSet lists /proc/PID/fd.
func fdSet(t *testing.T, pid string) map[string]bool {
	t.Helper()
	es, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, e := range es {
		set[e.Name()] = true
	}
	return set
}

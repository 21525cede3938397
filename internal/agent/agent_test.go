package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// nobody is the uid/gid the test "user" account maps to, so that user
// switching is real while the test runs as root on the host.
const nobody = 65534

// env is one in-process agent on a temp socket with a temp passwd/group
// where "user" (uid 65534, member of group "extra" 4242) owns a temp home.
type env struct {
	t      *testing.T
	agent  *agent.Agent
	client *agentapi.Client
	ch     *agentapi.Channel
	cfg    agent.Config
	home   string
	dir    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	dir, err := os.MkdirTemp("", "berth-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home", "user")
	mustMkdir(t, home)
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	etc := filepath.Join(dir, "etc")
	mustMkdir(t, etc)
	writeFile(t, filepath.Join(etc, "passwd"), fmt.Sprintf(
		"root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d:user:%s:/bin/sh\n", nobody, nobody, home))
	writeFile(t, filepath.Join(etc, "group"), fmt.Sprintf(
		"root:x:0:\nnogroup:x:%d:\nextra:x:4242:other,user\n", nobody))
	cfg := agent.Config{
		SocketPath:       filepath.Join(dir, "run", "agent.sock"),
		PasswdPath:       filepath.Join(etc, "passwd"),
		GroupPath:        filepath.Join(etc, "group"),
		EnvFile:          filepath.Join(dir, "run", "env.json"),
		HookDir:          filepath.Join(etc, "on-restore.d"),
		HookLog:          filepath.Join(dir, "run", "on-restore.log"),
		RestoreCountFile: filepath.Join(dir, "run", "restore-count"),
		SandboxID:        "sbtest1",
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	mustMkdir(t, filepath.Join(dir, "run"))
	cfg.Key = newKey(t)
	ch, err := agentapi.Listen(cfg.SocketPath, cfg.SandboxID, cfg.Key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	a := agent.New(cfg)
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return &env{t: t, agent: a, client: ch.Client(), ch: ch, cfg: cfg, home: home, dir: dir}
}

func newKey(t *testing.T) []byte {
	k := make([]byte, agentapi.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// result is everything an exec stream carried.
type result struct {
	Stdout, Stderr, PTY string
	Exit                agentapi.Event
	Phases              *agentapi.ExecPhases // the exit event's, kept apart from Exit
}

// collect reads a stream to its end, checking "start" comes first.
func collect(t *testing.T, s *agentapi.Stream) result {
	t.Helper()
	defer s.Close()
	var r result
	var out, errb, pty strings.Builder
	first := true
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if first && ev.Type != "start" {
			t.Fatalf("first event = %q, want start", ev.Type)
		}
		first = false
		switch ev.Type {
		case "stdout":
			out.Write(ev.Data)
		case "stderr":
			errb.Write(ev.Data)
		case "pty":
			pty.Write(ev.Data)
		case "exit":
			ev.Pid = 0
			r.Phases = s.Phases()
			r.Exit = ev
		}
	}
	r.Stdout, r.Stderr, r.PTY = out.String(), errb.String(), pty.String()
	return r
}

func (e *env) run(req agentapi.ExecRequest) result {
	e.t.Helper()
	s, err := e.client.Exec(testCtx(e.t), req, 0)
	if err != nil {
		e.t.Fatalf("exec %+v: %v", req, err)
	}
	return collect(e.t, s)
}

func ok0() agentapi.Event {
	return agentapi.Event{Type: "exit", Exited: true, Status: "exit status 0"}
}

// wantErr checks err's kind and that its message mentions substr.
func wantErr(t *testing.T, err error, kind errs.Kind, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", kind)
	}
	if got := errs.KindOf(err); got != kind {
		t.Fatalf("kind = %v, want %v (err: %v)", got, kind, err)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

func TestHealthAndActivity(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	h, err := e.client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.Version != agent.Version || h.BootTime.IsZero() || h.RestoreCount != 0 {
		t.Fatalf("health = %+v", h)
	}
	act, err := e.client.Activity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !act.LastExec.IsZero() || !act.LastFileWrite.IsZero() || act.Running != 0 || act.OpenStreams != 0 {
		t.Fatalf("fresh activity = %+v", act)
	}
	s, err := e.client.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sleep", "30"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.WriteFile(ctx, "a.txt", "", 0, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	act, err = e.client.Activity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if act.LastExec.IsZero() || act.LastFileWrite.IsZero() || act.Running != 1 || act.OpenStreams != 1 {
		t.Fatalf("busy activity = %+v", act)
	}
	if err := e.client.Signal(ctx, start.Pid, 9); err != nil {
		t.Fatal(err)
	}
	collectRest(t, s)
	// The stream's handler finishes just after the client read its last
	// event, so the counters settle a moment later.
	deadline := time.Now().Add(2 * time.Second)
	for {
		act, err = e.client.Activity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if act.Running == 0 && act.OpenStreams == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after exit activity = %+v", act)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRestoredRunsHooks(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	writeFile(t, filepath.Join(e.cfg.HookDir, "20-second"), "#!/bin/sh\necho second count=$BERTH_RESTORE_COUNT\n")
	writeFile(t, filepath.Join(e.cfg.HookDir, "10-first"), "#!/bin/sh\necho first uid=$(id -u) >&2\n")
	writeFile(t, filepath.Join(e.cfg.HookDir, "30-not-executable"), "#!/bin/sh\necho never\n")
	for _, n := range []string{"10-first", "20-second"} {
		if err := os.Chmod(filepath.Join(e.cfg.HookDir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.client.Restored(ctx, agentapi.RestoredRequest{RestoreCount: 3, HostTime: time.Now()}); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(e.cfg.HookLog)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		if !strings.HasPrefix(l, "== ") || strings.HasSuffix(l, "exit status 0") {
			lines = append(lines, strings.TrimPrefix(l, "== "))
		}
	}
	want := []string{"first uid=0", "10-first: exit status 0", "second count=3", "20-second: exit status 0"}
	if d := cmp.Diff(want, lines); d != "" {
		t.Fatalf("hook log (-want +got):\n%s\nfull log:\n%s", d, log)
	}
	count, err := os.ReadFile(e.cfg.RestoreCountFile)
	if err != nil || string(count) != "3\n" {
		t.Fatalf("restore count file = %q, %v", count, err)
	}
	h, err := e.client.Health(ctx)
	if err != nil || h.RestoreCount != 3 {
		t.Fatalf("health = %+v, %v", h, err)
	}
	got := e.run(agentapi.ExecRequest{Shell: "echo $BERTH_RESTORE_COUNT"})
	if got.Stdout != "3\n" {
		t.Fatalf("BERTH_RESTORE_COUNT in exec = %q", got.Stdout)
	}
	wantErr(t, e.client.Restored(ctx, agentapi.RestoredRequest{RestoreCount: -1}), errs.InvalidArgument, "restore_count")
}

// TestQuiesceAndRekey: /quiesce closes the session (the daemon's signal
// that a checkpoint may start) and the agent stops dialing; a fork's
// /restored rekeys it, so its next session authenticates as the child
// only: a channel accepting the old identity alone gets nothing.
func TestQuiesceAndRekey(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	childKey := newKey(t)
	if err := e.client.Restored(ctx, agentapi.RestoredRequest{RestoreCount: 1, SandboxID: "sbchild",
		Key: hex.EncodeToString(childKey)}); err != nil {
		t.Fatal(err)
	}
	if got := e.run(agentapi.ExecRequest{Shell: "echo $BERTH_SANDBOX_ID"}); got.Stdout != "sbchild\n" {
		t.Fatalf("BERTH_SANDBOX_ID after a fork restore = %q", got.Stdout)
	}
	wantErr(t, e.client.Restored(ctx, agentapi.RestoredRequest{RestoreCount: 1, SandboxID: "x", Key: "abcd"}), errs.InvalidArgument, "key")
	if err := e.client.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.WaitDisconnected(ctx, 5*time.Second); err != nil {
		t.Fatalf("session still up after quiesce: %v", err)
	}
	// Quiesced: the agent does not come back on its own.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := e.client.Health(short)
	cancel()
	if err == nil {
		t.Fatal("a quiesced agent answered")
	}
	// The old identity is refused by what the agent now says it is.
	e.ch.Close()
	old, err := agentapi.Listen(e.cfg.SocketPath, e.cfg.SandboxID, e.cfg.Key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.agent.Listen(); err != nil {
		t.Fatal(err)
	}
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = old.Client().Health(short)
	cancel()
	old.Close()
	if err == nil {
		t.Fatal("the rekeyed agent authenticated with its parent's identity")
	}
	child, err := agentapi.Listen(e.cfg.SocketPath, "sbchild", childKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer child.Close()
	if h, err := child.Client().WaitReady(ctx, 10*time.Millisecond); err != nil || !h.OK {
		t.Fatalf("rekeyed agent on the child's channel: %+v, %v", h, err)
	}
}

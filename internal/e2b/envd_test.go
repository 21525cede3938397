package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-dev/berth/api/gen/filesystem/filesystemconnect"
	"github.com/berth-dev/berth/api/gen/process"
	"github.com/berth-dev/berth/api/gen/process/processconnect"
	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/audit"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/notes"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

// agentBackend is the in-test Backend: one sandbox whose agent is a real
// berth-agent process on the host. Only the envd path (Auth's
// SandboxByToken over a real store holding the sandbox, Agent) is served;
// the daemon is tested in its own package and the control plane end to end
// by test/e2b.
type agentBackend struct {
	mu    sync.Mutex
	sb    sandbox.Sandbox
	agent *agentapi.Client
	st    store.Store
	auth  *auth.Service
}

func (b *agentBackend) setState(st sandbox.State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sb.State = st
	if _, err := b.st.UpdateSandbox(context.Background(), b.sb.ID, func(s *sandbox.Sandbox) error {
		s.State = st
		return nil
	}); err != nil {
		panic(err)
	}
}

func (b *agentBackend) Agent(_ context.Context, owner, id string) (*agentapi.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if owner != b.sb.Owner || id != b.sb.ID {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	if b.sb.State != sandbox.Running {
		return nil, errs.E(errs.Unavailable, "sandbox %q is %s", id, b.sb.State)
	}
	return b.agent, nil
}

var errControlPlaneUnused = errs.E(errs.NotImplemented, "control plane is not served by the envd test backend")

func (b *agentBackend) Create(context.Context, daemon.CreateRequest) (*sandbox.Sandbox, error) {
	return nil, errControlPlaneUnused
}
func (b *agentBackend) Get(context.Context, string, string) (*sandbox.Sandbox, error) {
	return nil, errControlPlaneUnused
}
func (b *agentBackend) List(context.Context, daemon.ListFilter) ([]*sandbox.Sandbox, string, error) {
	return nil, "", errControlPlaneUnused
}
func (b *agentBackend) Delete(context.Context, string, string) error { return errControlPlaneUnused }
func (b *agentBackend) SetExpiry(context.Context, string, string, time.Time) (*sandbox.Sandbox, error) {
	return nil, errControlPlaneUnused
}

// Auth is real: the store has no API keys, and the sandbox's token hash.
func (b *agentBackend) Auth() *auth.Service { return b.auth }

// Sandbox stats are the control plane's, unused here.
func (b *agentBackend) Admission() *admission.Service { return nil }

// The control plane's pause, fork and snapshots are not used by the envd tests.
func (b *agentBackend) Checkpoints() *checkpoint.Service { return nil }
func (b *agentBackend) Snapshots() *checkpoint.Snapshots { return nil }
func (b *agentBackend) Store() store.Store               { return b.st }
func (b *agentBackend) Notes() *notes.Service            { return nil }
func (b *agentBackend) Audit() *audit.Service            { return nil } // nothing audited

var _ Backend = (*daemon.Daemon)(nil)

// envdEnv is a real berth-agent behind the real envd handlers on 127.0.0.1.
type envdEnv struct {
	t       *testing.T
	backend *agentBackend
	url     string
	dir     string
	proc    processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
	http    *http.Client
}

const testToken = "tok-0123456789abcdef"

var buildAgent = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "berth-e2b-agent-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "berth-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/berth-agent")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build berth-agent: %v\n%s", err, out)
	}
	return bin, nil
})

func newEnvdEnv(t *testing.T) *envdEnv {
	t.Helper()
	testutil.RequireRoot(t)
	bin, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	key := make([]byte, agentapi.KeySize)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	ch, err := agentapi.Listen(sock, "sbxe2btest1", key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	cmd := exec.Command(bin, "--run-dir", dir, "--state-dir", dir)
	cmd.Env = append(os.Environ(), "BERTH_SANDBOX_ID=sbxe2btest1", "BERTH_AGENT_KEY="+hex.EncodeToString(key))
	var logBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
		}
		if t.Failed() {
			t.Logf("berth-agent log:\n%s", logBuf.String())
		}
	})
	client := ch.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.WaitReady(ctx, 20*time.Millisecond); err != nil {
		t.Fatalf("agent not ready: %v\n%s", err, logBuf.String())
	}
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sb := sandbox.Sandbox{
		ID: "sbxe2btest1", Owner: "alice", State: sandbox.Running, AccessTokenHash: auth.TokenHash(testToken), Template: "default",
	}
	if err := st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	b := &agentBackend{agent: client, sb: sb, st: st,
		auth: auth.New(st, t.TempDir(), time.Now, bytes.Repeat([]byte{7}, auth.TokenKeySize))}
	s := New(b, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	srv := httptest.NewServer(s.Handler(nil))
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		srv.CloseClientConnections()
		srv.Close()
	})
	e := &envdEnv{t: t, backend: b, url: srv.URL, dir: dir, http: hc}
	opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(sandboxHeaders{})}
	e.proc = processconnect.NewProcessClient(hc, srv.URL, opts...)
	e.fs = filesystemconnect.NewFilesystemClient(hc, srv.URL, opts...)
	return e
}

// sandboxHeaders adds the headers the SDK sends on every envd RPC.
type sandboxHeaders struct{}

func setSDKHeaders(h http.Header) {
	h.Set("E2b-Sandbox-Id", "sbxe2btest1")
	h.Set("E2b-Sandbox-Port", "49983")
	h.Set("X-Access-Token", testToken)
	h.Set("Keepalive-Ping-Interval", "1")
}

func (sandboxHeaders) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		setSDKHeaders(req.Header())
		return next(ctx, req)
	}
}

func (sandboxHeaders) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		setSDKHeaders(conn.RequestHeader())
		return conn
	}
}

func (sandboxHeaders) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// runResult is what one Start stream produced.
type runResult struct {
	pid            uint32
	stdout, stderr string
	end            *process.ProcessEvent_EndEvent
	keepalives     int
	err            error
}

func bash(cmd string) *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}
}

func (e *envdEnv) run(ctx context.Context, req *process.StartRequest) runResult {
	e.t.Helper()
	stream, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return runResult{err: err}
	}
	defer stream.Close()
	var res runResult
	first := true
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if first {
			if ev.GetStart() == nil {
				e.t.Fatalf("first event is %v, want start", ev)
			}
			res.pid = ev.GetStart().GetPid()
			first = false
			continue
		}
		switch {
		case ev.GetData() != nil:
			res.stdout += string(ev.GetData().GetStdout())
			res.stderr += string(ev.GetData().GetStderr())
		case ev.GetKeepalive() != nil:
			res.keepalives++
		case ev.GetEnd() != nil:
			res.end = ev.GetEnd()
		}
	}
	res.err = stream.Err()
	return res
}

func TestEnvdProcess(t *testing.T) {
	e := newEnvdEnv(t)
	ctx := context.Background()

	t.Run("exit codes and output", func(t *testing.T) {
		no := false
		r := e.run(ctx, &process.StartRequest{Process: bash("echo out; echo err >&2; exit 3"), Stdin: &no})
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.stdout != "out\n" || r.stderr != "err\n" {
			t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
		}
		if r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
			t.Errorf("end = %v", r.end)
		}
		r = e.run(ctx, &process.StartRequest{Process: bash("true"), Stdin: &no})
		if r.err != nil || r.end.GetExitCode() != 0 || r.end.Error != nil || r.end.GetStatus() != "exit status 0" {
			t.Errorf("clean exit: err %v end %v", r.err, r.end)
		}
	})

	t.Run("env cwd user", func(t *testing.T) {
		no := false
		cwd := "/tmp"
		cfg := bash(`echo "$A:$(pwd):$(whoami)"`)
		cfg.Envs = map[string]string{"A": "2"}
		cfg.Cwd = &cwd
		r := e.run(ctx, &process.StartRequest{Process: cfg, Stdin: &no})
		if r.err != nil || r.stdout != "2:/tmp:root\n" {
			t.Fatalf("err %v stdout %q", r.err, r.stdout)
		}
		missing := "/does/not/exist"
		cfg = bash("true")
		cfg.Cwd = &missing
		r = e.run(ctx, &process.StartRequest{Process: cfg, Stdin: &no})
		if connect.CodeOf(r.err) != connect.CodeInvalidArgument {
			t.Errorf("missing cwd: err %v, want invalid_argument", r.err)
		}
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{
			Cmd: "/bin/bash", Args: []string{"-c", "whoami"}, Cwd: &cwd}, Stdin: &no})
		req.Header().Set("Authorization", "Basic bm9ib2R5Og==") // nobody:
		stream, err := e.proc.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for stream.Receive() {
			out += string(stream.Msg().GetEvent().GetData().GetStdout())
		}
		stream.Close()
		if stream.Err() != nil || out != "nobody\n" {
			t.Errorf("as nobody: err %v out %q", stream.Err(), out)
		}
		req = connect.NewRequest(&process.StartRequest{Process: bash("whoami"), Stdin: &no})
		req.Header().Set("Authorization", "Basic bm9zdWNodXNlcjo=") // nosuchuser:
		r = e.runReq(ctx, req)
		if connect.CodeOf(r.err) != connect.CodeUnauthenticated {
			t.Errorf("unknown user: err %v, want unauthenticated", r.err)
		}
	})

	t.Run("timeout kills the process", func(t *testing.T) {
		no := false
		marker := filepath.Join(e.dir, "timeout-marker")
		tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		r := e.run(tctx, &process.StartRequest{Process: bash("sleep 3; touch " + marker), Stdin: &no})
		if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
			t.Fatalf("err %v, want deadline_exceeded", r.err)
		}
		e.waitGone(r.pid)
		time.Sleep(2 * time.Second)
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("process outlived its Connect-Timeout-Ms")
		}
	})

	t.Run("keepalives while silent", func(t *testing.T) {
		no := false
		r := e.run(ctx, &process.StartRequest{Process: bash("sleep 2.5; echo done"), Stdin: &no})
		if r.err != nil || r.stdout != "done\n" || r.keepalives < 1 {
			t.Errorf("err %v stdout %q keepalives %d", r.err, r.stdout, r.keepalives)
		}
	})

	t.Run("background, disconnect, reattach, list, kill", func(t *testing.T) {
		no := false
		sctx, cancel := context.WithCancel(ctx)
		stream, err := e.proc.Start(sctx, connect.NewRequest(&process.StartRequest{
			Process: bash("for i in $(seq 1 300); do echo tick $i; sleep 0.2; done"), Stdin: &no, Tag: ptr("bg")}))
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
			t.Fatalf("no start event: %v", stream.Err())
		}
		pid := stream.Msg().GetEvent().GetStart().GetPid()
		cancel() // the client goes away: the process must survive
		stream.Close()
		time.Sleep(500 * time.Millisecond)

		list, err := e.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var found *process.ProcessInfo
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == pid {
				found = p
			}
		}
		if found == nil || found.GetTag() != "bg" || found.GetConfig().GetCmd() != "/bin/bash" {
			t.Fatalf("pid %d not listed after disconnect: %v", pid, list.Msg.GetProcesses())
		}

		actx, acancel := context.WithCancel(ctx)
		defer acancel()
		att, err := e.proc.Connect(actx, connect.NewRequest(&process.ConnectRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "bg"}}}))
		if err != nil {
			t.Fatal(err)
		}
		if !att.Receive() || att.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect: first event %v err %v", att.Msg(), att.Err())
		}
		gotTick := false
		for !gotTick && att.Receive() {
			gotTick = strings.Contains(string(att.Msg().GetEvent().GetData().GetStdout()), "tick")
		}
		if !gotTick {
			t.Fatalf("no output after reattach: %v", att.Err())
		}

		if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
			Signal:  process.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		var end *process.ProcessEvent_EndEvent
		for att.Receive() {
			if ev := att.Msg().GetEvent().GetEnd(); ev != nil {
				end = ev
			}
		}
		att.Close()
		if end == nil || end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" || end.GetError() != "signal: killed" {
			t.Errorf("end after kill = %v (stream err %v)", end, att.Err())
		}
		e.waitGone(pid)
		_, err = e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
			Signal:  process.Signal_SIGNAL_SIGKILL}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("second kill: %v, want not_found", err)
		}
		_, err = e.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
			Signal:  process.Signal(2)}))
		if connect.CodeOf(err) != connect.CodeUnimplemented {
			t.Errorf("SIGINT: %v, want unimplemented", err)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		yes := true
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := e.proc.Start(sctx, connect.NewRequest(&process.StartRequest{Process: bash("cat"), Stdin: &yes}))
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() {
			t.Fatal(stream.Err())
		}
		sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("abc\n")}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		var out string
		var end *process.ProcessEvent_EndEvent
		for stream.Receive() {
			out += string(stream.Msg().GetEvent().GetData().GetStdout())
			if ev := stream.Msg().GetEvent().GetEnd(); ev != nil {
				end = ev
			}
		}
		if out != "abc\n" || end == nil || end.GetExitCode() != 0 {
			t.Errorf("out %q end %v err %v", out, end, stream.Err())
		}
	})
}

func ptr[T any](v T) *T { return &v }

func (e *envdEnv) runReq(ctx context.Context, req *connect.Request[process.StartRequest]) runResult {
	stream, err := e.proc.Start(ctx, req)
	if err != nil {
		return runResult{err: err}
	}
	defer stream.Close()
	for stream.Receive() {
	}
	return runResult{err: stream.Err()}
}

// waitGone waits until pid leaves the process list.
func (e *envdEnv) waitGone(pid uint32) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		list, err := e.proc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			e.t.Fatal(err)
		}
		live := false
		for _, p := range list.Msg.GetProcesses() {
			live = live || p.GetPid() == pid
		}
		if !live {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("pid %d still listed", pid)
}

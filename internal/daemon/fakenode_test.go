package daemon

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// fakeNode is the lifecycle core over an in-process host: the fake runtime,
// plain-directory root filesystems, a real SQLite store and template layer
// store, and a real berth agent (internal/agent, in-process) per running
// sandbox that dials the daemon's real, authenticated channel socket. The
// clock is the test's. Nothing needs root; nothing sleeps.
type fakeNode struct {
	t       *testing.T
	d       *Daemon
	rt      *fake.Runtime
	fs      *fake.Dirs
	clk     *fakeClock
	st      store.Store
	tpl     *template.Store
	dataDir string
	cfg     Config
	agents  *inProcessAgents
}

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newFakeNode(t *testing.T, opts fake.Options) *fakeNode {
	t.Helper()
	// Registered first, so it runs last: after the daemon and the agents
	// are gone, none of their goroutines may be left.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	// Short: agent socket paths must fit in 107 bytes.
	dataDir, err := os.MkdirTemp("", "bd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpl, err := template.Open(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{t: t, fs: &fake.Dirs{}, st: st, tpl: tpl, dataDir: dataDir,
		clk:    &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)},
		agents: &inProcessAgents{t: t, m: map[string]*agent.Agent{}}}
	opts.Now = n.clk.Now
	if opts.Boot == nil {
		opts.Boot = n.agents.boot
	}
	if opts.Signal == nil {
		opts.Signal = n.agents.signal
	}
	n.rt = fake.New(opts)
	n.cfg = Config{
		DataDir: dataDir, DefaultRuntime: n.rt.Name(), AgentPath: writeTinyELF(t),
		ReadyTimeout: 10 * time.Second, Now: n.clk.Now, Filesystem: n.fs,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	n.addTemplate("default", nil)
	n.start()
	// Last cleanup first: the daemon, then every PID 1 (the agents).
	t.Cleanup(func() {
		n.d.Close()
		list, _ := n.rt.List(context.Background())
		for _, s := range list {
			_ = n.rt.Delete(context.Background(), s.ID)
		}
	})
	return n
}

// start makes a daemon over the node (a fresh process after a restart).
func (n *fakeNode) start() {
	n.t.Helper()
	d, err := New(n.cfg, n.st, map[string]runtime.Runtime{n.rt.Name(): n.rt}, n.tpl)
	if err != nil {
		n.t.Fatal(err)
	}
	n.d = d
}

// crash ends the daemon process the way a kill -9 does for the host: its
// channel sockets close, the sandboxes and their agents keep running, and
// nothing of its memory survives. A new daemon takes over the store.
func (n *fakeNode) crash() {
	n.d.cancel()
	n.d.wg.Wait()
	n.d.chans.closeAll()
	n.start()
}

// addTemplate stores a ready template with one (empty) layer.
func (n *fakeNode) addTemplate(name string, startCmd []string) store.Template {
	n.t.Helper()
	dg := strings.Repeat(hex.EncodeToString([]byte(name))[:2], 32)
	if err := os.MkdirAll(n.tpl.LayerPath(dg), 0o755); err != nil {
		n.t.Fatal(err)
	}
	tp, err := n.st.PutTemplate(context.Background(), store.Template{
		Name: name, Fingerprint: template.Fingerprint([]string{dg}, startCmd, nil), Layers: []string{dg},
		StartCmd: startCmd, State: store.TemplateReady, CreatedAt: n.clk.Now(), UpdatedAt: n.clk.Now(),
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return tp
}

func (n *fakeNode) get(id string) *sandbox.Sandbox {
	n.t.Helper()
	sb, err := n.st.GetSandbox(context.Background(), id)
	if err != nil {
		n.t.Fatal(err)
	}
	return sb
}

// events lists the reasons of a sandbox's events, oldest first.
func (n *fakeNode) reasons(id string) []string {
	n.t.Helper()
	evs, err := n.st.ListEvents(context.Background(), store.EventFilter{SandboxID: id})
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Reason)
	}
	return out
}

// inProcessAgents runs a real berth agent for every fake PID 1: it dials
// the channel socket the spec mounts at agentapi.SocketDir with the key in
// the spec's environment — the key of the sandbox whose memory image it
// was restored from, for a restore, as a real agent would.
type inProcessAgents struct {
	t  *testing.T
	mu sync.Mutex
	m  map[string]*agent.Agent
}

func (a *inProcessAgents) boot(ctx context.Context, spec runtime.Spec, from *runtime.Spec) (func(), error) {
	id, env := spec.ID, spec.Env
	if from != nil {
		id, env = from.ID, from.Env
	}
	var key []byte
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "BERTH_AGENT_KEY="); ok {
			key, _ = hex.DecodeString(v)
		}
	}
	var runDir string
	for _, m := range spec.Mounts {
		if m.Target == agentapi.SocketDir {
			runDir = m.Source
		}
	}
	state := filepath.Join(spec.BundleDir, "agent-state")
	// The in-process agent has no root of its own: it reads its users from
	// the sandbox's (empty) root filesystem, so a request naming a user
	// (a fork's /etc/machine-id write as root) is refused instead of acting
	// on the host's files.
	ag := agent.New(agent.Config{
		PasswdPath: filepath.Join(spec.RootFS, "etc", "passwd"), GroupPath: filepath.Join(spec.RootFS, "etc", "group"),
		SocketPath: filepath.Join(runDir, agentapi.SocketName), EnvFile: filepath.Join(runDir, "env.json"),
		HookDir: filepath.Join(state, "hooks"), HookLog: filepath.Join(state, "on-restore.log"),
		RestoreCountFile: filepath.Join(state, "restore-count"),
		SandboxID:        id, Key: key, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := ag.Listen(); err != nil {
		ag.Close()
		return nil, err
	}
	a.mu.Lock()
	a.m[spec.ID] = ag
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		if a.m[spec.ID] == ag {
			delete(a.m, spec.ID)
		}
		a.mu.Unlock()
		ag.Close()
	}, nil
}

// signal is the agent's PID 1 signal handling: quiesce and reopen.
func (a *inProcessAgents) signal(id string, sig syscall.Signal) {
	a.mu.Lock()
	ag := a.m[id]
	a.mu.Unlock()
	if ag == nil {
		return
	}
	switch sig {
	case syscall.SIGUSR1:
		ag.Quiesce()
	case syscall.SIGUSR2:
		_ = ag.Listen()
	}
}

// writeTinyELF writes the smallest file installAgent accepts as a static
// agent binary: an ELF header with no program headers. The fake runtime
// never executes it.
func writeTinyELF(t *testing.T) string {
	t.Helper()
	h := make([]byte, 64)
	copy(h, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	le := binary.LittleEndian
	le.PutUint16(h[16:], 2)  // ET_EXEC
	le.PutUint16(h[18:], 62) // EM_X86_64
	le.PutUint32(h[20:], 1)  // EV_CURRENT
	le.PutUint16(h[52:], 64) // e_ehsize
	le.PutUint16(h[54:], 56) // e_phentsize
	le.PutUint16(h[58:], 64) // e_shentsize
	p := filepath.Join(t.TempDir(), "berth-agent")
	if err := os.WriteFile(p, h, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

package daemon

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/admission"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// testClock is an injected clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// signalsDaemon is a daemon over a real SQLite store with no runtime (the
// reaper loop's tests are admission's; pin_test uses this one).
func signalsDaemon(t *testing.T, st store.Store, clk *testClock) *Daemon {
	t.Helper()
	fast := reaper.Policy{ClientIdle: reaper.Duration(time.Minute), APIIdle: reaper.Duration(time.Minute),
		WriteIdle: reaper.Duration(time.Minute), EgressIdle: reaper.Duration(time.Minute), CPUIdle: reaper.Duration(time.Minute),
		PauseMode: sandbox.PauseFreeze, DiskAfter: reaper.Duration(10 * time.Minute), ArchiveAfter: reaper.Duration(time.Hour)}
	cfg := Config{DataDir: t.TempDir(), AgentPath: "/nonexistent", Now: clk.Now,
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Reaper: reaper.Config{DefaultPolicy: "fast", Policies: map[string]reaper.Policy{"fast": fast}}}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bg, cancel := context.WithCancel(context.Background())
	d := &Daemon{cfg: cfg, log: cfg.Log, store: st, runtimes: map[string]runtime.Runtime{},
		locks: map[string]*sync.Mutex{}, chans: map[string]*agentapi.Channel{}, pauseCh: map[string]chan struct{}{},
		bg: bg, cancel: cancel}
	d.adm = admission.New(d, cfg.admissionConfig())
	d.net = hostnet.New(d, cfg.DataDir, nil, d.adm)
	t.Cleanup(d.Close)
	return d
}

// attrsOf builds typed attrs from the legacy key/value form the tables use.
func attrsOf(extra map[string]string) sandbox.Attrs {
	a, _ := sandbox.AttrsFromExtra(extra)
	return a
}

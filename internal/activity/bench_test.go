package activity

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agent"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// BenchmarkExecRoundTrip is the exec path's cost of the recorder: one exec
// of /bin/true through a real agent channel to a real berth-agent (in this
// process, running host processes), from the request to the exit event
// and the stream's close, without an observer and then with the activity
// observer of a Service whose writer runs against a real SQLite file.
// What it adds is the trace (a few atomic counters, one map entry) and one
// non-blocking queue send; the SQLite write happens on the writer.
func BenchmarkExecRoundTrip(b *testing.B) {
	dir, err := os.MkdirTemp("", "berth-act-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path, key := filepath.Join(dir, "agent.sock"), make([]byte, agentapi.KeySize)
	ch, err := agentapi.Listen(path, "a", key, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	ag := agent.New(agent.Config{SocketPath: path, EnvFile: path + ".env", SandboxID: "a", Key: key,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer ag.Close()
	go func() { _ = ag.Listen() }()
	ctx := context.Background()
	c := ch.Client()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if _, err := c.WaitReady(wctx, 10*time.Millisecond); err != nil {
		b.Fatal(err)
	}
	cancel()

	st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateSandbox(ctx, &sandbox.Sandbox{ID: "a", Owner: "alice", Template: "t", Runtime: "runc",
		State: sandbox.Creating, ExpiryAction: sandbox.ExpireStop}); err != nil {
		b.Fatal(err)
	}
	svc := New(Config{}, storeCore{st: st}, st)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(rctx) }()
	defer func() { stop(); <-done }()

	one := func() {
		s, err := c.Exec(ctx, agentapi.ExecRequest{Argv: []string{"/bin/true"}, User: "root"}, 0)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := s.Next(); err != nil {
				break
			}
		}
		s.Close()
	}
	// Blocks of execs without and with the recorder, alternating, so the
	// load of a shared machine falls on both alike; each block's writer
	// work (the SQLite batches) lands in its own block. The figures are
	// the medians of the blocks' mean round trips.
	const block = 100
	var off, on []time.Duration
	for b.Loop() {
		for i, obs := range []agentapi.Observer{nil, svc.Observer("a")} {
			c.SetObserver(obs) // nothing else uses c meanwhile
			t0 := time.Now()
			for range block {
				one()
			}
			mean := time.Since(t0) / block
			if i == 0 {
				off = append(off, mean)
			} else {
				on = append(on, mean)
			}
		}
	}
	slices.Sort(off)
	slices.Sort(on)
	mOff, mOn := off[len(off)/2], on[len(on)/2]
	b.ReportMetric(float64(mOff.Microseconds()), "µs/exec-off")
	b.ReportMetric(float64(mOn.Microseconds()), "µs/exec-on")
	b.ReportMetric(100*float64(mOn-mOff)/float64(mOff), "%overhead")
}

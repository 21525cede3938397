package checkpoint

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
)

// freezeOnly is a runtime whose Freeze says when it was called; a pause
// by freeze calls nothing else of it.
type freezeOnly struct {
	runtime.Runtime
	frozen chan struct{}
}

func (r freezeOnly) Freeze(context.Context, string) error { close(r.frozen); return nil }

// pauseCore adds what a freeze pause needs to resumeCore.
type pauseCore struct {
	resumeCore
	rt runtime.Runtime
}

func (c pauseCore) Lock(string) func() { return func() {} }
func (c pauseCore) Visible(ctx context.Context, _, id string) (*sandbox.Sandbox, error) {
	return c.st.GetSandbox(ctx, id)
}
func (c pauseCore) RuntimeFor(*sandbox.Sandbox) (runtime.Runtime, error) { return c.rt, nil }

// TestPauseHooksBesideTheIntent: the before-pause hooks (the handoff note)
// run while the pausing intent is committed, and the sandbox is frozen
// only once they are done (the note asks the agent, which a freeze stops).
func TestPauseHooksBesideTheIntent(t *testing.T) {
	ctx := t.Context()
	st := openStore(t)
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	sb := &sandbox.Sandbox{ID: "sb1", Owner: "alice", Template: "tiny", TemplateID: "x", Runtime: "runc", State: sandbox.Running}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	rt := freezeOnly{frozen: make(chan struct{})}
	var sawIntent, frozenDuring bool
	hooks := &statehook.Bus{}
	hooks.Register("probe", statehook.Func(func(ctx context.Context, ev statehook.Event) error {
		if ev.Phase != statehook.BeforePause {
			return nil
		}
		if ev.Sandbox.State != sandbox.Running {
			t.Errorf("the hook was told state %s, want the sandbox as it was (running)", ev.Sandbox.State)
		}
		// Wait (bounded) for the intent: with the hooks before it, it
		// never comes while the hook runs.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			cur, err := st.GetSandbox(ctx, sb.ID)
			if err == nil && cur.State == sandbox.Pausing {
				sawIntent = true
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // the freeze must still wait
		select {
		case <-rt.frozen:
			frozenDuring = true
		default:
		}
		return nil
	}))
	s := &Service{core: pauseCore{resumeCore{&testCore{st: st, dir: t.TempDir(), now: now}}, rt},
		cfg: Config{Hooks: hooks}, log: slog.New(slog.DiscardHandler), pauseCh: map[string]chan struct{}{}}
	out, err := s.PauseAs(ctx, "", sb.ID, sandbox.PauseFreeze, "alice", "paused")
	if err != nil {
		t.Fatal(err)
	}
	if !sawIntent {
		t.Error("the before-pause hook never saw the pausing intent committed: it ran before the intent, not beside it")
	}
	if frozenDuring {
		t.Error("the sandbox was frozen while a before-pause hook still ran")
	}
	select {
	case <-rt.frozen:
	default:
		t.Error("the sandbox was never frozen")
	}
	if out.State != sandbox.Paused || out.PauseActual != sandbox.PauseFreeze {
		t.Errorf("after the pause: state %s, paused with %q; want paused by freeze", out.State, out.PauseActual)
	}
}

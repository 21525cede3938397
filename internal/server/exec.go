package server

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/trace"
)

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest = wire.ExecRequest

// exec starts a process and streams its events as NDJSON (one agentapi.Event
// per line): start, stdout/stderr/pty data, exit. Closing the stream does
// not kill the process; it can be re-attached.
func (s sandboxAPI) exec(w http.ResponseWriter, r *http.Request, p daemon.Principal) (err error) {
	t0 := time.Now()
	var req ExecRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if len(req.Cmd) == 0 && req.Shell == "" {
		return errs.Field("cmd", "must not be empty")
	}
	timeout, err := ParseDuration(req.Timeout)
	if err != nil || timeout < 0 {
		return errs.Field("timeout", "must be a duration like 30s")
	}
	id := r.PathValue("id")
	ctx, span := trace.Phase(r.Context(), "sandbox.exec", trace.String("sandbox.id", id), trace.Bool("exec.tty", req.TTY != nil))
	defer span.EndErr(&err)
	r = r.WithContext(ctx) // the exit is recorded on this span (pipeEvents)
	t1 := time.Now()
	c, err := s.d.Agent(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	paused := s.d.Checkpoints().PauseSignal(id)
	t2 := time.Now()
	startCtx, startSpan := trace.Phase(ctx, "exec.start")
	st, err := c.Exec(startCtx, agentapi.ExecRequest{
		Argv: req.Cmd, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Stdin: req.Stdin, TTY: ttySize(req.TTY), Tag: req.Tag, TimeoutMs: timeout.Milliseconds(),
	}, keepalive(r))
	startSpan.End(err)
	if err != nil {
		return err
	}
	t3 := time.Now()
	rel := s.pipeEvents(w, r, st, paused)
	if s.log.Enabled(ctx, slog.LevelDebug) {
		// The exec's phases, like the boot's: where a round trip goes. The
		// agent_* ones are what the agent reported on its exit event
		// (agentapi.ExecPhases): the sandbox's word, for this log only.
		tm := st.Timing()
		var ph agentapi.ExecPhases
		if p := st.Phases(); p != nil {
			ph = *p
		}
		s.log.DebugContext(ctx, "exec", "sandbox_id", id, "decode_ms", ms(t1.Sub(t0)), "lookup_ms", ms(t2.Sub(t1)),
			"conn_ms", ms(tm.Conn), "conn_reused", tm.Reused, "agent_start_ms", ms(tm.Answer-tm.Conn),
			"first_event_ms", ms(rel.first.Sub(t3)), "exit_ms", ms(rel.exit.Sub(t3)), "relay_ms", ms(rel.relay),
			"total_ms", ms(time.Since(t0)), "agent_plan_ms", usMs(ph.PlanUs), "agent_spawn_ms", usMs(ph.SpawnUs),
			"agent_start_write_ms", usMs(ph.StartUs), "agent_run_ms", usMs(ph.RunUs), "agent_drain_ms", usMs(ph.DrainUs))
	}
	return nil
}

// usMs is a count of µs the agent reported, in ms; nonsense (negative,
// beyond an hour) reads as 0.
func usMs(us int64) float64 {
	if us < 0 || us > int64(time.Hour/time.Microsecond) {
		return 0
	}
	return float64(us) / 1000
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func keepalive(r *http.Request) int {
	n, _ := strconv.Atoi(r.URL.Query().Get("keepalive"))
	return n
}

type eventStream interface {
	Next() (agentapi.Event, error)
	Close() error
}

// relayTiming is when a stream's first event and its exit event came from
// the agent, and how long writing them to the client took in all.
type relayTiming struct {
	first, exit time.Time
	relay       time.Duration
}

// pipeEvents copies agent events to the client, flushing each, and ends
// the stream with an error event if the sandbox is paused meanwhile.
func (s sandboxAPI) pipeEvents(w http.ResponseWriter, r *http.Request, st eventStream, paused <-chan struct{}) (tm relayTiming) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	events := make(chan agentapi.Event, 16)
	done := make(chan error, 1)
	go func() {
		defer close(events)
		for {
			ev, err := st.Next()
			if err != nil {
				done <- err
				return
			}
			events <- ev
		}
	}()
	exited := false
	defer func() {
		end := func() {
			st.Close()
			for range events {
			}
		}
		if exited {
			// The agent's answer ends right after its exit event (Close reads
			// that end, bounded by agentapi's drain limits): the client's
			// answer need not wait for it.
			go end()
			return
		}
		end()
	}()
	enc := json.NewEncoder(w)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if err := <-done; err != nil && !errors.Is(err, io.EOF) {
					_ = enc.Encode(agentapi.Event{Type: "error", Error: err.Error()})
					_ = rc.Flush()
				}
				return
			}
			now := time.Now()
			if tm.first.IsZero() {
				tm.first = now
			}
			if ev.Type == "exit" {
				tm.exit = now
				trace.Set(r.Context(), trace.Int("process.exit_code", ev.ExitCode), trace.String("process.signal", ev.Signal))
				// The last event: not flushed, so it leaves with the end of
				// the chunked answer in one write once the handler returns,
				// and the client's read of it also reads the end (its
				// connection is then kept alive rather than closed).
				_ = enc.Encode(ev)
				tm.relay += time.Since(now)
				exited = true
				return
			}
			if err := enc.Encode(ev); err != nil {
				return
			}
			_ = rc.Flush()
			tm.relay += time.Since(now)
		case <-paused:
			_ = enc.Encode(agentapi.Event{Type: "error", Error: checkpoint.ErrPaused().Error()})
			_ = rc.Flush()
			return
		case <-r.Context().Done():
			return
		}
	}
}

func pid(r *http.Request) (int, error) {
	n, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || n <= 0 {
		return 0, errs.Field("pid", "must be a positive integer")
	}
	return n, nil
}

func (s sandboxAPI) listProcesses(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	list, err := c.Processes(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []agentapi.ProcessInfo{}
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s sandboxAPI) attach(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := pid(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	c, err := s.d.Agent(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	paused := s.d.Checkpoints().PauseSignal(id)
	st, err := c.Attach(r.Context(), n, keepalive(r))
	if err != nil {
		return err
	}
	s.pipeEvents(w, r, st, paused)
	return nil
}

func (s sandboxAPI) stdin(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := pid(r)
	if err != nil {
		return err
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "read stdin body")
	}
	if err := c.Input(r.Context(), n, data); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s sandboxAPI) closeStdin(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := pid(r)
	if err != nil {
		return err
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := c.CloseStdin(r.Context(), n); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s sandboxAPI) signal(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := pid(r)
	if err != nil {
		return err
	}
	var req agentapi.SignalRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Signal <= 0 || req.Signal > 64 {
		return errs.Field("signal", "must be a signal number between 1 and 64")
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := c.Signal(r.Context(), n, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s sandboxAPI) resize(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := pid(r)
	if err != nil {
		return err
	}
	var req agentapi.ResizeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Cols == 0 || req.Rows == 0 {
		return errs.Field("cols", "cols and rows must be positive")
	}
	c, err := s.d.Agent(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := c.Resize(r.Context(), n, req.Cols, req.Rows); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

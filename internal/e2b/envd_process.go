package e2b

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-dev/berth/api/gen/process"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// processService is envd's process.Process over the sandbox agent. The agent
// owns exec semantics (env precedence, cwd/user resolution, exit status
// strings, process timeouts); this is a translation.
type processService struct {
	s *Server
}

// Start runs a process and streams start, data, keepalive and end events.
// Connect-Timeout-Ms (the ctx deadline) bounds the process lifetime: it is
// passed to the agent, which kills the process at expiry. A client
// disconnect only closes the agent stream; the process keeps running.
func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	er := agentapi.ExecRequest{
		Argv:  append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:   cfg.GetEnvs(),
		Cwd:   cfg.GetCwd(),
		User:  rpcUser(req.Header()),
		Stdin: req.Msg.Stdin == nil || req.Msg.GetStdin(),
		Tag:   req.Msg.GetTag(),
	}
	if pty := req.Msg.GetPty(); pty != nil {
		er.TTY = &agentapi.TTYSize{Cols: uint16(pty.GetSize().GetCols()), Rows: uint16(pty.GetSize().GetRows())}
		er.Stdin = true
	}
	if dl, ok := ctx.Deadline(); ok {
		er.TimeoutMs = max(time.Until(dl).Milliseconds(), 1)
	}
	ag := targetFrom(ctx).agent
	st, err := ag.Exec(ctx, er, keepaliveSec(req.Header()))
	if err != nil {
		return connectError(err)
	}
	defer st.Close()
	pid := uint32(0)
	err = pumpProcess(ctx, st, true, func(ev *process.ProcessEvent) error {
		if s := ev.GetStart(); s != nil {
			pid = s.GetPid()
		}
		return stream.Send(&process.StartResponse{Event: ev})
	}, p.s.abortIfGone)
	if pid != 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The stream deadline and the agent's own timer race; kill here too so
		// the process is gone (and unlisted) by the time the client sees the timeout.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = ag.Signal(kctx, int(pid), 9)
		cancel()
	}
	return err
}

// Connect re-attaches to a running process: start, then only new output,
// then end. Its deadline ends only this stream.
func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t := targetFrom(ctx)
	pid, err := resolvePid(ctx, t.agent, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	st, err := t.agent.Attach(ctx, pid, keepaliveSec(req.Header()))
	if err != nil {
		return connectError(err)
	}
	defer st.Close()
	return pumpProcess(ctx, st, false, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	}, p.s.abortIfGone)
}

// pumpProcess forwards agent events until the exit event. For Start
// (ownsTimeout), an exit caused by the process timeout ends the stream with
// deadline_exceeded, which the SDK reports as TimeoutError. When the agent's
// stream breaks, broken runs first (abortIfGone).
func pumpProcess(ctx context.Context, st *agentapi.Stream, ownsTimeout bool, send func(*process.ProcessEvent) error, broken func(context.Context)) error {
	for {
		ev, err := st.Next()
		if err != nil {
			if ctxErr := streamCtxError(ctx); ctxErr != nil {
				return ctxErr
			}
			if broken != nil {
				broken(ctx)
			}
			if errors.Is(err, io.EOF) {
				return connect.NewError(connect.CodeUnavailable, errors.New("sandbox agent closed the process stream before the process ended"))
			}
			return connectError(err)
		}
		out, done, err := processEvent(ev, ownsTimeout)
		if err != nil {
			return err
		}
		if out != nil {
			if err := send(out); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// goneWait is how long a broken agent stream waits to learn whether its
// sandbox is going away (delete halts the sandbox before it records it).
const goneWait = 5 * time.Second

// abortIfGone ends the HTTP exchange abruptly when the stream's sandbox was
// killed, expired or paused under it: a stream that just ends would look
// like a clean answer or an agent fault. The SDK sees the connection drop,
// probes /health, gets the router's 502 and raises its TimeoutError "The
// sandbox was killed or reached its end of life while the request was in
// flight" — what E2B's own proxy produces when a sandbox dies mid-request.
// A sandbox still running returns normally (the caller reports the break).
func (s *Server) abortIfGone(ctx context.Context) {
	id := targetFrom(ctx).sb.ID
	deadline := time.Now().Add(goneWait)
	for {
		sb, err := s.d.Get(context.WithoutCancel(ctx), "", id)
		if errs.Is(err, errs.NotFound) || (err == nil && sb.State != sandbox.Running) {
			s.log.Info("e2b stream aborted: sandbox gone", "sandbox_id", id)
			panic(http.ErrAbortHandler)
		}
		if err != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamCtxError reports why a stream's context ended, as a Connect error.
func streamCtxError(ctx context.Context) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("stream deadline (Connect-Timeout-Ms) exceeded"))
	case ctx.Err() != nil:
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return nil
}

// agentTimeout is the exit event error the agent reports when it killed a
// process at its TimeoutMs.
const agentTimeout = "timeout"

// processEvent translates one agent event; done is true after the end event.
func processEvent(ev agentapi.Event, ownsTimeout bool) (out *process.ProcessEvent, done bool, err error) {
	switch ev.Type {
	case "start":
		return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(ev.Pid)}}}, false, nil
	case "stdout":
		return dataEvent(&process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}}), false, nil
	case "stderr":
		return dataEvent(&process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}}), false, nil
	case "pty":
		return dataEvent(&process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: ev.Data}}), false, nil
	case "keepalive":
		return &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}, false, nil
	case "exit":
		if ev.Error == agentTimeout && ownsTimeout {
			return nil, true, connect.NewError(connect.CodeDeadlineExceeded, errors.New(ev.Error))
		}
		return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(ev)}}, true, nil
	case "error":
		return nil, true, connect.NewError(connect.CodeInternal, errors.New(ev.Error))
	}
	return nil, false, nil // unknown event types from a newer agent are skipped
}

func dataEvent(d *process.ProcessEvent_DataEvent) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

// endEvent follows Go os/exec, as E2B does: a clean exit has no error; any
// other end carries the status as its error, and a signal exit code is -1.
func endEvent(ev agentapi.Event) *process.ProcessEvent_EndEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(ev.ExitCode), Exited: ev.Exited, Status: ev.Status}
	if !ev.Exited && end.ExitCode == 0 {
		end.ExitCode = -1
	}
	if end.Status == "" {
		end.Status = "exit status " + strconv.Itoa(int(end.ExitCode))
	}
	if !ev.Exited || ev.ExitCode != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return end
}

// List returns the live processes.
func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	procs, err := targetFrom(ctx).agent.Processes(ctx)
	if err != nil {
		return nil, connectError(err)
	}
	out := &process.ListResponse{Processes: make([]*process.ProcessInfo, 0, len(procs))}
	for _, pi := range procs {
		cfg := &process.ProcessConfig{Envs: pi.Env}
		if len(pi.Argv) > 0 {
			cfg.Cmd, cfg.Args = pi.Argv[0], pi.Argv[1:]
		}
		if pi.Cwd != "" {
			cfg.Cwd = &pi.Cwd
		}
		info := &process.ProcessInfo{Config: cfg, Pid: uint32(pi.Pid)}
		if pi.Tag != "" {
			info.Tag = &pi.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// SendInput writes to a process's stdin pipe or PTY.
func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t := targetFrom(ctx)
	pid, err := resolvePid(ctx, t.agent, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetInput()
	data := in.GetStdin()
	if in.GetPty() != nil {
		data = in.GetPty()
	}
	if err := t.agent.Input(ctx, pid, data); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// SendSignal delivers SIGKILL or SIGTERM; other signals are unimplemented.
func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sig := req.Msg.GetSignal()
	if sig != process.Signal_SIGNAL_SIGKILL && sig != process.Signal_SIGNAL_SIGTERM {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("signal: only SIGNAL_SIGKILL and SIGNAL_SIGTERM are supported"))
	}
	t := targetFrom(ctx)
	pid, err := resolvePid(ctx, t.agent, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := t.agent.Signal(ctx, pid, int(sig)); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// CloseStdin gives the process EOF on stdin.
func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t := targetFrom(ctx)
	pid, err := resolvePid(ctx, t.agent, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := t.agent.CloseStdin(ctx, pid); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// Update resizes a PTY.
func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t := targetFrom(ctx)
	pid, err := resolvePid(ctx, t.agent, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if err := t.agent.Resize(ctx, pid, uint16(size.GetCols()), uint16(size.GetRows())); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// StreamInput is never called by the JS SDK (fetch cannot stream bodies).
func (p *processService) StreamInput(context.Context, *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("StreamInput is not supported; use SendInput"))
}

// resolvePid turns a selector into a pid; tags are looked up among the
// live processes.
func resolvePid(ctx context.Context, agent *agentapi.Client, sel *process.ProcessSelector) (int, error) {
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		return int(v.Pid), nil
	case *process.ProcessSelector_Tag:
		procs, err := agent.Processes(ctx)
		if err != nil {
			return 0, connectError(err)
		}
		for _, pi := range procs {
			if pi.Tag == v.Tag {
				return pi.Pid, nil
			}
		}
		return 0, connectError(errs.E(errs.NotFound, "no process with tag %q", v.Tag))
	}
	return 0, connectError(errs.Field("process", "a pid or tag selector is required"))
}

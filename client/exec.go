package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
)

func decodeJSON(r io.Reader, out any, what string) error {
	if err := json.NewDecoder(r).Decode(out); err != nil {
		return fmt.Errorf("decode %s response: %w", what, err)
	}
	return nil
}

// Process is a running command's event stream, from Exec or Attach. Read it
// with Next until the "exit" event, or hand it to Wait. Closing the stream
// does not kill the process: Attach reads it again.
type Process struct {
	s    *Sandbox
	body io.ReadCloser
	dec  *json.Decoder
	// Pid is the process id in the sandbox, known once Next has returned the
	// "start" event (Exec waits for it).
	Pid  int
	done bool
}

// ExecOptions tune an exec stream.
type ExecOptions struct {
	// Keepalive asks for a "keepalive" event every N seconds of silence.
	Keepalive int
}

// Exec starts req.Cmd (or req.Shell) and returns once the server has
// answered; the first event is normally "start". Set req.Stdin to feed it
// with WriteStdin, req.TTY for a terminal.
func (s *Sandbox) Exec(ctx context.Context, req wire.ExecRequest, o ...ExecOptions) (*Process, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return s.stream(ctx, s.path("exec"), bytesReader(b), "application/json", o)
}

// Attach reads a running process's stream again (from now on).
func (s *Sandbox) Attach(ctx context.Context, pid int, o ...ExecOptions) (*Process, error) {
	p, err := s.stream(ctx, s.path("processes", strconv.Itoa(pid), "attach"), nil, "", o)
	if p != nil {
		p.Pid = pid
	}
	return p, err
}

func (s *Sandbox) stream(ctx context.Context, path string, body io.Reader, ct string, o []ExecOptions) (*Process, error) {
	var q url.Values
	if len(o) > 0 && o[0].Keepalive > 0 {
		q = url.Values{"keepalive": {strconv.Itoa(o[0].Keepalive)}}
	}
	resp, err := s.c.Do(ctx, http.MethodPost, path, s.query(q), body, ct)
	if err != nil {
		return nil, err
	}
	return &Process{s: s, body: resp.Body, dec: json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))}, nil
}

// Next is the next event. After the "exit" event it returns io.EOF.
func (p *Process) Next() (wire.ExecEvent, error) {
	var ev wire.ExecEvent
	if p.done {
		return ev, io.EOF
	}
	if err := p.dec.Decode(&ev); err != nil {
		if errors.Is(err, io.EOF) {
			return ev, &Error{Kind: KindUnavailable, Message: "exec stream ended without an exit status"}
		}
		return ev, &Error{Kind: KindUnavailable, Message: "exec stream", Err: err}
	}
	switch ev.Type {
	case wire.ExecStart:
		p.Pid = ev.Pid
	case wire.ExecExit:
		p.done = true
	}
	return ev, nil
}

// Close ends the stream (not the process).
func (p *Process) Close() error { return p.body.Close() }

// Wait copies stdout (and pty output) and stderr to the writers (either may
// be nil) until the exit event, and returns it. An "error" event is an
// *Error of kind unavailable.
func (p *Process) Wait(stdout, stderr io.Writer) (wire.ExecEvent, error) {
	defer p.Close()
	for {
		ev, err := p.Next()
		if err != nil {
			return ev, err
		}
		switch ev.Type {
		case wire.ExecStdout, wire.ExecPTY:
			if stdout != nil {
				_, _ = stdout.Write(ev.Data)
			}
		case wire.ExecStderr:
			if stderr != nil {
				_, _ = stderr.Write(ev.Data)
			}
		case wire.ExecError:
			return ev, &Error{Kind: KindUnavailable, Message: "exec: " + ev.Error}
		case wire.ExecExit:
			return ev, nil
		}
	}
}

// Run runs a command to its end, copying its output, and returns its exit
// code.
func (s *Sandbox) Run(ctx context.Context, req wire.ExecRequest, stdout, stderr io.Writer) (int, error) {
	p, err := s.Exec(ctx, req)
	if err != nil {
		return 0, err
	}
	ev, err := p.Wait(stdout, stderr)
	return ev.ExitCode, err
}

// WriteStdin sends data to a process started with Stdin.
func (s *Sandbox) WriteStdin(ctx context.Context, pid int, data []byte) error {
	return s.c.callBody(ctx, http.MethodPost, s.path("processes", strconv.Itoa(pid), "stdin"), s.query(nil),
		bytesReader(data), "application/octet-stream", nil)
}

// CloseStdin closes a process's stdin (it reads EOF).
func (s *Sandbox) CloseStdin(ctx context.Context, pid int) error {
	return s.call(ctx, http.MethodPost, nil, nil, nil, "processes", strconv.Itoa(pid), "close-stdin")
}

// Signal sends signal number sig (e.g. 2, 9, 15) to a process.
func (s *Sandbox) Signal(ctx context.Context, pid, sig int) error {
	return s.call(ctx, http.MethodPost, nil, wire.SignalRequest{Signal: sig}, nil, "processes", strconv.Itoa(pid), "signal")
}

// Resize sets a process's terminal size.
func (s *Sandbox) Resize(ctx context.Context, pid int, cols, rows uint16) error {
	return s.call(ctx, http.MethodPost, nil, wire.ResizeRequest{Cols: cols, Rows: rows}, nil, "processes", strconv.Itoa(pid), "resize")
}

// Processes lists the processes started through the agent that still run.
func (s *Sandbox) Processes(ctx context.Context) ([]wire.ProcessInfo, error) {
	var list []wire.ProcessInfo
	err := s.call(ctx, http.MethodGet, nil, nil, &list, "processes")
	return list, err
}

package cli

import (
	"context"
	"flag"
	"io"
	"os"
	"syscall"

	"golang.org/x/term"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/errs"
)

func runExec(e *env, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	interactive := fs.Bool("i", false, "keep stdin open and stream it to the command")
	tty := fs.Bool("t", false, "allocate a terminal")
	var envs multi
	fs.Var(&envs, "env", "K=V (repeatable)")
	cwd := fs.String("cwd", "", "working directory (default: the user's home)")
	user := fs.String("user", "", "user (default: user; root on request)")
	timeout := fs.String("timeout", "", "kill the command after this long, e.g. 30s")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageError{"exec: usage: berth exec [flags] ID -- CMD..."}
	}
	id, cmd := pos[0], pos[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		return usageError{"exec: missing command after --"}
	}
	envMap, err := kvs("env", envs)
	if err != nil {
		return err
	}
	req := wire.ExecRequest{Cmd: cmd, Env: envMap, Cwd: *cwd, User: *user, Timeout: *timeout, Stdin: *interactive}
	var restore func()
	if *tty {
		cols, rows := 80, 24
		if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			if c, r, err := term.GetSize(int(f.Fd())); err == nil {
				cols, rows = c, r
			}
			if st, err := term.MakeRaw(int(f.Fd())); err == nil {
				restore = func() { _ = term.Restore(int(f.Fd()), st) }
			}
		}
		req.TTY = &wire.TTYSize{Cols: uint16(cols), Rows: uint16(rows)}
		req.Stdin = true
		if _, ok := envMap["TERM"]; !ok {
			if req.Env == nil {
				req.Env = map[string]string{}
			}
			req.Env["TERM"] = "xterm-256color"
		}
	}
	if restore != nil {
		defer restore()
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	box := c.Sandbox(id)
	// The stream lives on its own context: Ctrl-C is forwarded to the
	// command as SIGINT instead of cutting the stream.
	sctx, cancel := context.WithCancel(context.WithoutCancel(e.ctx))
	defer cancel()
	p, err := box.Exec(sctx, req)
	if err != nil {
		return err
	}
	defer p.Close()
	for {
		ev, err := p.Next()
		if err != nil {
			return err
		}
		switch ev.Type {
		case wire.ExecStart:
			if req.Stdin {
				go pumpStdin(sctx, box, p.Pid, e.stdin, req.TTY != nil)
			}
			if req.TTY != nil {
				go forwardResize(sctx, box, p.Pid, e.stdin)
			}
			go forwardInterrupt(sctx, e.ctx, box, p.Pid)
		case wire.ExecStdout, wire.ExecPTY:
			_, _ = e.stdout.Write(ev.Data)
		case wire.ExecStderr:
			_, _ = e.stderr.Write(ev.Data)
		case wire.ExecError:
			return errs.E(errs.Unavailable, "exec: %s", ev.Error)
		case wire.ExecExit:
			if restore != nil {
				restore()
				restore = nil
			}
			if ev.Error != "" && ev.Exited == false && ev.Signal == "" && ev.ExitCode == 0 {
				return errs.E(errs.Internal, "exec: %s", ev.Error)
			}
			code := ev.ExitCode
			if !ev.Exited && code < 0 {
				code = 128 + signalNumber(ev.Signal)
			}
			if code == 0 {
				return nil
			}
			return exitStatus{code}
		}
	}
}

// signalNumber maps the agent's os/exec-style signal name ("killed",
// "segmentation fault") back to its number, for the 128+N exit code.
func signalNumber(name string) int {
	for n := 1; n < 32; n++ {
		if syscall.Signal(n).String() == name {
			return n
		}
	}
	return 1
}

func pumpStdin(ctx context.Context, box *client.Sandbox, pid int, in io.Reader, tty bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if box.WriteStdin(ctx, pid, append([]byte(nil), buf[:n]...)) != nil {
				return
			}
		}
		if err != nil {
			if !tty {
				_ = box.CloseStdin(ctx, pid)
			}
			return
		}
	}
}

func forwardInterrupt(ctx, interrupted context.Context, box *client.Sandbox, pid int) {
	select {
	case <-ctx.Done():
	case <-interrupted.Done():
		_ = box.Signal(ctx, pid, int(syscall.SIGINT))
	}
}

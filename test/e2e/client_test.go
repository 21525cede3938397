package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// TestGoClient drives a real `berth serve` through the public Go client
// alone: create, exec with split streams, stdin, signals and a PTY, files,
// pause/resume, snapshot, fork and events.
func TestGoClient(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := client.New(s.url, s.key)

	sb, err := c.Create(ctx, wire.CreateRequest{Template: "tiny", TTL: "10m", Labels: map[string]string{"sdk": "go"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != wire.StateRunning || sb.Labels["sdk"] != "go" || sb.Owner == "" {
		t.Fatalf("created %+v", sb)
	}
	box := c.Sandbox(sb.ID)

	var out, errOut bytes.Buffer
	code, err := box.Run(ctx, wire.ExecRequest{Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, &out, &errOut)
	if err != nil || code != 3 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Fatalf("run: code %d err %v stdout %q stderr %q", code, err, out.String(), errOut.String())
	}

	// stdin: fed once the process has started, then closed.
	p, err := box.Exec(ctx, wire.ExecRequest{Cmd: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	for done := false; !done; {
		ev, err := p.Next()
		if err != nil {
			t.Fatalf("cat stream: %v", err)
		}
		switch ev.Type {
		case wire.ExecStart:
			if err := box.WriteStdin(ctx, p.Pid, []byte("hello via stdin")); err != nil {
				t.Fatal(err)
			}
			if err := box.CloseStdin(ctx, p.Pid); err != nil {
				t.Fatal(err)
			}
		case wire.ExecStdout:
			out.Write(ev.Data)
		case wire.ExecExit:
			if ev.ExitCode != 0 || !ev.Exited {
				t.Fatalf("cat exit %+v", ev)
			}
			done = true
		}
	}
	p.Close()
	if out.String() != "hello via stdin" {
		t.Fatalf("cat echoed %q", out.String())
	}

	// A signal ends a process; the exit event says which.
	p, err = box.Exec(ctx, wire.ExecRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := p.Next(); err != nil || ev.Type != wire.ExecStart {
		t.Fatalf("sleep: first event %+v, %v", ev, err)
	}
	if err := box.Signal(ctx, p.Pid, int(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if ev, err := p.Wait(nil, nil); err != nil || ev.Exited || ev.Signal != "killed" {
		t.Fatalf("killed sleep: %+v, %v", ev, err)
	}

	// A PTY: output arrives as pty events and the size is the one asked for.
	out.Reset()
	code, err = box.Run(ctx, wire.ExecRequest{Cmd: []string{"stty", "size"}, TTY: &wire.TTYSize{Cols: 91, Rows: 27}}, &out, nil)
	if err != nil || code != 0 || !strings.Contains(out.String(), "27 91") {
		t.Fatalf("stty size in a pty: code %d, %v, %q", code, err, out.String())
	}

	// Files in and out.
	if _, err := box.WriteFile(ctx, "/tmp/sdk/hello.txt", strings.NewReader("hi from go\n"), client.WriteFileOptions{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	st, err := box.Stat(ctx, "/tmp/sdk/hello.txt", "")
	if err != nil || st.Size != 11 || st.Mode != 0o600 {
		t.Fatalf("stat: %+v, %v", st, err)
	}
	list, err := box.ListDir(ctx, "/tmp/sdk", 1, "")
	if err != nil || len(list) != 1 || list[0].Name != "hello.txt" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	r, err := box.ReadFile(ctx, "/tmp/sdk/hello.txt", "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "hi from go\n" {
		t.Fatalf("read back %q", b)
	}
	if _, err := box.ReadFile(ctx, "/tmp/sdk/missing", ""); !client.IsNotFound(err) {
		t.Fatalf("read of a missing file: %v, want not_found", err)
	}

	// Pause and resume; the answer says the mode taken.
	paused, err := box.Pause(ctx, wire.PauseFreeze)
	if err != nil || paused.State != wire.StatePaused || paused.PauseActual != wire.PauseFreeze {
		t.Fatalf("pause: %+v, %v", paused, err)
	}
	if _, err := box.Pause(ctx, wire.PauseFreeze); client.KindOf(err) == "" || client.KindOf(err) == client.KindInternal {
		t.Fatalf("pausing a paused sandbox: %v, want a state error kind", err)
	}
	resumed, err := box.Resume(ctx)
	if err != nil || resumed.State != wire.StateRunning {
		t.Fatalf("resume: %+v, %v", resumed, err)
	}

	// Snapshot and fork: the child has the parent's file.
	sn, err := box.Snapshot(ctx, "sdk-snap")
	if err != nil || sn.SourceSandbox != sb.ID || sn.Name != "sdk-snap" {
		t.Fatalf("snapshot: %+v, %v", sn, err)
	}
	fr, err := box.Fork(ctx, 1)
	if err != nil || len(fr.Sandboxes) != 1 || fr.Parent != sb.ID {
		t.Fatalf("fork: %+v, %v", fr, err)
	}
	child := c.Sandbox(fr.Sandboxes[0].ID)
	out.Reset()
	if code, err := child.Run(ctx, wire.ExecRequest{Cmd: []string{"cat", "/tmp/sdk/hello.txt"}}, &out, nil); err != nil || code != 0 || out.String() != "hi from go\n" {
		t.Fatalf("child reads %q (code %d, %v)", out.String(), code, err)
	}

	all, err := c.ListAll(ctx, client.ListOptions{Labels: map[string]string{"sdk": "go"}})
	if err != nil || len(all) < 1 {
		t.Fatalf("list by label: %d, %v", len(all), err)
	}
	evs, err := box.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sawPause bool
	for _, ev := range evs {
		sawPause = sawPause || (ev.Type == "transition" && ev.To == wire.StatePaused)
	}
	if !sawPause {
		t.Fatalf("events lack the pause: %+v", evs)
	}

	for _, id := range []string{child.ID, sb.ID} {
		if err := c.Sandbox(id).Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := box.Get(ctx); !client.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want not_found", err)
	}
}

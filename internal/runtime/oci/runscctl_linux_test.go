package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
)

// commandLog records the runtime commands a backend runs.
type commandLog struct {
	mu  sync.Mutex
	ops []string
}

func (l *commandLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *commandLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "runtime command" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "op" {
			l.mu.Lock()
			l.ops = append(l.ops, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}
func (l *commandLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *commandLog) WithGroup(string) slog.Handler      { return l }

// take returns the ops recorded since the last take.
func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := l.ops
	l.ops = nil
	return ops
}

// runscBox is a runsc sandbox whose shell counts in count, a file of
// the host dir mounted at /run/x.
type runscBox struct {
	id, dir, count string
	spec           runtime.Spec
}

func startRunscBox(t testing.TB, o *OCI) *runscBox {
	t.Helper()
	ctx := context.Background()
	base := t.TempDir()
	dir, root := busyboxBundle(t, base, nil, false)
	host := filepath.Join(base, "x")
	if err := os.MkdirAll(host, 0o777); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("ctl%d", time.Now().UnixNano()%1e9)
	spec := runtime.Spec{ID: id, BundleDir: dir, RootFS: root,
		Args:      []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /run/x/count; sleep 0.02; done"},
		Mounts:    []runtime.Mount{{Source: host, Target: "/run/x"}},
		Resources: runtime.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20, Pids: 128},
		LogPath:   filepath.Join(base, "log")}
	if err := o.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Delete(context.Background(), id) })
	return &runscBox{id: id, dir: dir, count: filepath.Join(host, "count"), spec: spec}
}

func (b *runscBox) counter() int {
	raw, _ := os.ReadFile(b.count)
	n, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	return n
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantState(t *testing.T, o *OCI, id, want string) {
	t.Helper()
	// o.State runs `runsc state`: runsc's own reading of its state file.
	if st, err := o.State(context.Background(), id); err != nil || st.State != want {
		t.Fatalf("runsc state %s = %+v, %v; want %s", id, st, err, want)
	}
}

// assertStill checks that the counter does not move for ten of its ticks.
func assertStill(t *testing.T, b *runscBox) {
	t.Helper()
	frozen := b.counter()
	time.Sleep(200 * time.Millisecond)
	if got := b.counter(); got != frozen {
		t.Fatalf("the counter moved from %d to %d while paused", frozen, got)
	}
}

// TestRunscDirectPauseResume: Freeze and Thaw of a runsc sandbox run no
// runsc command: the Sentry is asked over its control socket; the
// process inside stops and goes on, and runsc's own `runsc state`
// reports paused and running. A sandbox paused that way is checkpointed
// and deleted by the usual runsc commands.
func TestRunscDirectPauseResume(t *testing.T) {
	o := newBackend(t, Runsc)
	cmds := &commandLog{}
	o.log = slog.New(cmds)
	ctx := context.Background()
	b := startRunscBox(t, o)
	eventually(t, "the counter runs", func() bool { return b.counter() >= 3 })

	for round := 0; round < 2; round++ {
		freezeDirect(t, cmds, o, b, "")
		if err := o.Freeze(ctx, b.id); err == nil {
			t.Fatal("Freeze of a paused sandbox succeeded")
		}
		thawDirect(t, cmds, o, b, "")
		moved := b.counter()
		eventually(t, "the counter runs again", func() bool { return b.counter() > moved+2 })
	}
	// A paused Sentry must not be asked to resume twice (its stop is
	// counted): runsc's state says running, so both paths refuse.
	if err := o.Thaw(ctx, b.id); err == nil {
		t.Fatal("Thaw of a running sandbox succeeded")
	}

	// Paused directly, then checkpointed and deleted by runsc.
	if err := o.Freeze(ctx, b.id); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "mem")
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := o.Checkpoint(cctx, b.id, image); err != nil {
		t.Fatalf("checkpoint of a sandbox paused directly: %v", err)
	}
	if err := o.Delete(ctx, b.id); err != nil {
		t.Fatal(err)
	}
	if _, err := o.State(ctx, b.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("state after delete: %v, want not found", err)
	}

	// Restored by runsc, it is paused and resumed directly again: the
	// restored sandbox process listens on the socket the new state names.
	if err := o.Restore(cctx, b.spec, image); err != nil {
		t.Fatalf("restore: %v", err)
	}
	wantState(t, o, b.id, "running")
	moved := b.counter()
	eventually(t, "the restored counter runs", func() bool { return b.counter() > moved+2 })
	freezeDirect(t, cmds, o, b, " of a restored sandbox")
	thawDirect(t, cmds, o, b, " of a restored sandbox")
	moved = b.counter()
	eventually(t, "the restored counter runs again", func() bool { return b.counter() > moved+2 })
	if err := o.Delete(ctx, b.id); err != nil {
		t.Fatal(err)
	}

	// And one paused directly is deleted while paused.
	c := startRunscBox(t, o)
	eventually(t, "the second counter runs", func() bool { return c.counter() >= 3 })
	if err := o.Freeze(ctx, c.id); err != nil {
		t.Fatal(err)
	}
	if err := o.Delete(ctx, c.id); err != nil {
		t.Fatalf("delete of a sandbox paused directly: %v", err)
	}
	if _, err := o.State(ctx, c.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("state after delete: %v, want not found", err)
	}
}

// TestRunscPauseFallsBack: when the control socket is not in the runsc
// root (runsc bound it in /tmp or /run, its fallbacks) or is a symlink
// there, the direct path refuses it without connecting and Freeze and
// Thaw run `runsc pause` and `runsc resume`, which work.
func TestRunscPauseFallsBack(t *testing.T) {
	o := newBackend(t, Runsc)
	cmds := &commandLog{}
	o.log = slog.New(cmds)
	ctx := context.Background()
	b := startRunscBox(t, o)
	eventually(t, "the counter runs", func() bool { return b.counter() >= 3 })

	sock := filepath.Join(o.cfg.Root, "runsc-"+b.id+".sock")
	elsewhere := filepath.Join(t.TempDir(), "runsc-"+b.id+".sock")
	if err := os.Rename(sock, elsewhere); err != nil { // a bound socket keeps working when moved
		t.Fatal(err)
	}
	stateFile := filepath.Join(o.cfg.Root, b.id+"_sandbox:"+b.id+".state")
	setSocketPath := func(p string) {
		t.Helper()
		raw, err := os.ReadFile(stateFile)
		if err != nil {
			t.Fatal(err)
		}
		var st map[string]any
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		st["sandbox"].(map[string]any)["controlSocketPath"] = p
		raw, _ = json.Marshal(st)
		if err := os.WriteFile(stateFile, raw, 0o640); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name  string
		setup func()
	}{
		{"socket outside the root", func() { setSocketPath(elsewhere) }},
		{"symlink in the root", func() {
			if err := os.Symlink(elsewhere, sock); err != nil {
				t.Fatal(err)
			}
			setSocketPath(sock)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			err := o.runscControl(ctx, b.id, runscPause)
			var ns *notSentError
			if !errors.As(err, &ns) || !errs.Is(err, errs.FailedPrecondition) {
				t.Fatalf("direct pause = %v, want a refusal before sending", err)
			}
			wantState(t, o, b.id, "running")
			cmds.take()
			if err := o.Freeze(ctx, b.id); err != nil {
				t.Fatal(err)
			}
			if ops := cmds.take(); len(ops) != 1 || ops[0] != "pause" {
				t.Fatalf("Freeze ran %v, want runsc pause", ops)
			}
			wantState(t, o, b.id, "paused")
			assertStill(t, b)
			cmds.take()
			if err := o.Thaw(ctx, b.id); err != nil {
				t.Fatal(err)
			}
			if ops := cmds.take(); len(ops) != 1 || ops[0] != "resume" {
				t.Fatalf("Thaw ran %v, want runsc resume", ops)
			}
			wantState(t, o, b.id, "running")
			moved := b.counter()
			eventually(t, "the counter runs again", func() bool { return b.counter() > moved+2 })
		})
	}
}

// fakeSentry is a control server in a runsc root made by the test: a
// hostile Sentry, answering each call with answer (nil: never).
type fakeSentry struct {
	o        *OCI
	root, id string
	ln       *net.UnixListener
	wg       sync.WaitGroup
	got      chan string
}

func newFakeSentry(t *testing.T, answer func(method string) []byte) *fakeSentry {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	f := &fakeSentry{root: root, id: "fake1", got: make(chan string, 4),
		o: &OCI{name: Runsc, cfg: Config{Root: root}, log: slog.New(slog.DiscardHandler)}}
	base := filepath.Join(root, f.id+"_sandbox:"+f.id)
	if err := os.WriteFile(base+".lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "runsc-"+f.id+".sock")
	f.writeState(t, "running", sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	done := make(chan struct{})
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				dec := json.NewDecoder(c)
				for { // urpc: calls one after another on a connection
					var call struct {
						Method string          `json:"method"`
						Arg    json.RawMessage `json:"arg"`
					}
					if err := dec.Decode(&call); err != nil {
						return
					}
					f.got <- call.Method + " " + string(call.Arg)
					a := answer(call.Method)
					if a == nil {
						<-done
						return
					}
					if _, err := c.Write(a); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); close(done); f.wg.Wait() })
	return f
}

func (f *fakeSentry) writeState(t *testing.T, status, sock string) {
	t.Helper()
	raw := fmt.Sprintf(`{"id":%q,"status":%q,"owner":"","spec":{"ociVersion":"1.0.0","hostname":"h"},`+
		`"sandbox":{"id":%q,"pid":%d,"controlSocketPath":%q},"saver":{"rootDir":%q}}`,
		f.id, status, f.id, os.Getpid(), sock, f.root)
	if err := os.WriteFile(filepath.Join(f.root, f.id+"_sandbox:"+f.id+".state"), []byte(raw), 0o640); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeSentry) state(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(f.root, f.id+"_sandbox:"+f.id+".state"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRunscControlAgainstAHostileSentry: the direct client sends urpc's
// call, records the new status keeping the rest of runsc's state file,
// and bounds what a Sentry answers: an oversized answer, no answer and a
// refusal are errors that leave the state file as it was.
func TestRunscControlAgainstAHostileSentry(t *testing.T) {
	defer func(d time.Duration) { controlAnswerWait = d }(controlAnswerWait)
	controlAnswerWait = 300 * time.Millisecond
	ok := []byte(`{"success":true,"err":"","result":{}}`)
	t.Run("answers", func(t *testing.T) {
		f := newFakeSentry(t, func(string) []byte { return ok })
		if err := f.o.runscControl(context.Background(), f.id, runscPause); err != nil {
			t.Fatal(err)
		}
		if got := <-f.got; got != "containerManager.Pause {}" {
			t.Fatalf("the Sentry got %q", got)
		}
		st := f.state(t)
		if string(st["status"]) != `"paused"` || string(st["spec"]) != `{"ociVersion":"1.0.0","hostname":"h"}` || !bytes.Contains(st["saver"], []byte(f.root)) {
			t.Fatalf("state file after pause: %s", st)
		}
		if err := f.o.runscControl(context.Background(), f.id, runscResume); err != nil {
			t.Fatal(err)
		}
		if got := <-f.got; got != "containerManager.Resume {}" {
			t.Fatalf("the Sentry got %q", got)
		}
		if st := f.state(t); string(st["status"]) != `"running"` {
			t.Fatalf("state after resume: %s", st["status"])
		}
		if left, _ := filepath.Glob(filepath.Join(f.root, "*tmp*")); len(left) != 0 {
			t.Fatalf("left behind: %v", left)
		}
	})
	for _, tc := range []struct {
		name   string
		answer []byte
		kind   errs.Kind
		says   string
	}{
		{"oversized", append([]byte(`{"success":true,"err":"`), bytes.Repeat([]byte("a"), 1<<20)...), errs.Internal, "larger than"},
		{"endless", bytes.Repeat([]byte(" "), 1<<20), errs.Internal, "larger than"},
		{"deep", bytes.Repeat([]byte("["), 1<<20), errs.Internal, "decode"},
		{"refusal", []byte(`{"success":false,"err":"cannot pause: not running","result":null}`), errs.FailedPrecondition, "not running"},
		{"garbage", []byte(`}`), errs.Internal, "decode"},
		{"silence", nil, errs.Unavailable, "no answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeSentry(t, func(string) []byte { return tc.answer })
			err := f.o.runscControl(context.Background(), f.id, runscPause)
			var ns *notSentError
			if err == nil || errors.As(err, &ns) || !errs.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("pause = %v, want a %s error after sending that says %q", err, tc.kind, tc.says)
			}
			if len(err.Error()) > 4096 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			if st := f.state(t); string(st["status"]) != `"running"` {
				t.Fatalf("state after a failed pause: %s", st["status"])
			}
		})
	}
	t.Run("answers after the caller is gone", func(t *testing.T) {
		f := newFakeSentry(t, func(string) []byte { time.Sleep(150 * time.Millisecond); return ok })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := f.o.runscControl(ctx, f.id, runscPause); err != nil {
			t.Fatalf("pause answered after the caller's deadline: %v, want it recorded", err)
		}
		if st := f.state(t); string(st["status"]) != `"paused"` {
			t.Fatalf("state after a late answer: %s", st["status"])
		}
	})
	t.Run("state file not writable", func(t *testing.T) {
		f := newFakeSentry(t, func(string) []byte { return ok })
		// The temporary file's name taken by a directory: the save fails.
		if err := os.Mkdir(filepath.Join(f.root, f.id+"_sandbox:"+f.id+".state.berth-tmp"), 0o700); err != nil {
			t.Fatal(err)
		}
		err := f.o.runscControl(context.Background(), f.id, runscPause)
		if err == nil || isNotSent(err) {
			t.Fatalf("pause with an unwritable state file: %v, want an error", err)
		}
		if a, b := <-f.got, <-f.got; a != "containerManager.Pause {}" || b != "containerManager.Resume {}" {
			t.Fatalf("the Sentry got %q then %q, want the pause undone", a, b)
		}
		if st := f.state(t); string(st["status"]) != `"running"` {
			t.Fatalf("state: %s", st["status"])
		}
	})
	t.Run("waits for runsc's lock", func(t *testing.T) {
		f := newFakeSentry(t, func(string) []byte { return ok })
		lock, err := os.Open(filepath.Join(f.root, f.id+"_sandbox:"+f.id+".lock"))
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil { // as a runsc command holds it
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := f.o.runscControl(ctx, f.id, runscPause); !isNotSent(err) || !errs.Is(err, errs.Unavailable) {
			t.Fatalf("pause while runsc holds the lock: %v, want unavailable before sending", err)
		}
		fd, released := int(lock.Fd()), make(chan struct{})
		go func() { time.Sleep(50 * time.Millisecond); _ = unix.Flock(fd, unix.LOCK_UN); close(released) }()
		if err := f.o.runscControl(context.Background(), f.id, runscPause); err != nil {
			t.Fatalf("pause once the lock is free: %v", err)
		}
		<-released
		if got := <-f.got; got != "containerManager.Pause {}" {
			t.Fatalf("the Sentry got %q", got)
		}
	})
	t.Run("refused before sending", func(t *testing.T) {
		f := newFakeSentry(t, func(string) []byte { return ok })
		ctx := context.Background()
		f.writeState(t, "running", "/tmp/runsc-"+f.id+".sock")
		if err := f.o.runscControl(ctx, f.id, runscPause); !isNotSent(err) {
			t.Fatalf("socket outside the root: %v", err)
		}
		f.writeState(t, "paused", filepath.Join(f.root, "runsc-"+f.id+".sock"))
		if err := f.o.runscControl(ctx, f.id, runscPause); !isNotSent(err) || !errs.Is(err, errs.FailedPrecondition) {
			t.Fatalf("pause of a paused container: %v", err)
		}
		if err := f.o.runscControl(ctx, "other", runscPause); !isNotSent(err) || !errs.Is(err, errs.NotFound) {
			t.Fatalf("unknown container: %v", err)
		}
		if err := os.Chmod(f.root, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := f.o.runscControl(ctx, f.id, runscResume); !isNotSent(err) || !strings.Contains(err.Error(), "others could plant") {
			t.Fatalf("world-writable root: %v", err)
		}
		select {
		case got := <-f.got:
			t.Fatalf("the Sentry was asked %q", got)
		default:
		}
	})
}

func isNotSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns)
}

// BenchmarkRunscPauseResume: a pause and a resume of a runsc sandbox by
// the control socket, then by the runsc command, alternated in every
// round so that both see the same load.
func BenchmarkRunscPauseResume(b *testing.B) {
	o := newBackend(b, Runsc)
	box := startRunscBox(b, o)
	ctx := context.Background()
	paths := []struct {
		name string
		call func(runscCall) error
	}{
		{"socket", func(c runscCall) error { return o.runscControl(ctx, box.id, c) }},
		{"command", func(c runscCall) error { _, err := o.exec(ctx, false, c.op, box.id, c.op, box.id); return err }},
	}
	took := make([][2]time.Duration, len(paths))
	for b.Loop() {
		for i, p := range paths {
			for j, c := range []runscCall{runscPause, runscResume} {
				start := time.Now()
				if err := p.call(c); err != nil {
					b.Fatalf("%s %s: %v", p.name, c.op, err)
				}
				took[i][j] += time.Since(start)
			}
		}
	}
	for i, p := range paths {
		b.ReportMetric(float64(took[i][0].Microseconds())/1000/float64(b.N), p.name+"-pause-ms")
		b.ReportMetric(float64(took[i][1].Microseconds())/1000/float64(b.N), p.name+"-resume-ms")
	}
}

// freezeDirect freezes b and checks that no runsc command ran (the call
// went over the control socket), that runsc's state says paused and that
// b's counter stands still; what names the sandbox in the failures.
func freezeDirect(t *testing.T, cmds *commandLog, o *OCI, b *runscBox, what string) {
	t.Helper()
	callDirect(t, cmds, o, b, "Freeze"+what, o.Freeze, "paused")
	assertStill(t, b)
}

// thawDirect is freezeDirect's Thaw: no command, and runsc's state says running.
func thawDirect(t *testing.T, cmds *commandLog, o *OCI, b *runscBox, what string) {
	t.Helper()
	callDirect(t, cmds, o, b, "Thaw"+what, o.Thaw, "running")
}

// callDirect makes call on b, checks that it ran no runsc command and
// that runsc's state is then state.
func callDirect(t *testing.T, cmds *commandLog, o *OCI, b *runscBox, name string, call func(context.Context, string) error, state string) {
	t.Helper()
	cmds.take()
	if err := call(context.Background(), b.id); err != nil {
		t.Fatal(err)
	}
	if ops := cmds.take(); len(ops) != 0 {
		t.Fatalf("%s ran runsc %v, want no command", name, ops)
	}
	wantState(t, o, b.id, state)
}

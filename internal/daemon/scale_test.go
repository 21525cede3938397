package daemon

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/runtime/fake"
	"github.com/berth-dev/berth/internal/sandbox"
)

// scaleN is the sandbox count of the scale unit tests: enough that a
// per-sandbox runtime call shows as N calls, small enough for CI.
const scaleN = 100

// Reconcile after a restart asks each runtime for its containers once, not
// once per sandbox (a `runc state` process per sandbox made a restart over
// 1,000 sandboxes take tens of seconds), and still adopts every one.
func TestReconcileListsOnceAtScale(t *testing.T) {
	n := newFakeNode(t, fake.Options{})
	ctx := context.Background()
	ids := make([]string, 0, scaleN)
	for range scaleN {
		sb, err := n.d.Create(ctx, CreateRequest{Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	n.crash()
	states, lists := n.rt.Calls(fake.OpState), n.rt.Calls(fake.OpList)
	if err := n.d.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if got := n.rt.Calls(fake.OpState) - states; got != 0 {
		t.Errorf("Reconcile over %d running sandboxes made %d State calls, want 0 (one List)", scaleN, got)
	}
	if got := n.rt.Calls(fake.OpList) - lists; got != 1 {
		t.Errorf("Reconcile made %d List calls, want 1", got)
	}
	for _, id := range ids {
		if sb := n.get(id); sb.State != sandbox.Running {
			t.Fatalf("%s is %s (%s) after Reconcile, want running (adopted)", id, sb.State, sb.Reason)
		}
	}
}

// The watch's cheap liveness check tells a live PID 1 from a dead one, a
// zombie, and another process that got the same PID.
func TestHostProcAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, ok := hostProcOf(cmd.Process.Pid)
	if !ok || !p.alive() {
		t.Fatalf("a running sleep is not alive: %+v %v", p, ok)
	}
	defer p.release()
	if !p.hasFD {
		t.Errorf("no pidfd on this kernel (%+v): the watch polls /proc", p)
	}
	// Without pidfds (kernels before 5.3) the start time tells PID reuse apart.
	start, ok := procStart(p.pid)
	byStart := hostProc{pid: p.pid, start: start}
	if !ok || !byStart.alive() {
		t.Fatalf("a running sleep is not alive by its start time: %+v %v", byStart, ok)
	}
	if (hostProc{pid: p.pid, start: start + 1}).alive() {
		t.Errorf("a process with another start time passed for the one recorded")
	}
	_ = cmd.Process.Kill()
	// Killed, not yet waited for: a zombie is not a live PID 1.
	deadline := time.Now().Add(10 * time.Second)
	for p.alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p.alive() || byStart.alive() {
		t.Errorf("a killed process (zombie) is still alive (pidfd %v, start time %v)", p.alive(), byStart.alive())
	}
	_ = cmd.Wait()
	if p.alive() || byStart.alive() {
		t.Errorf("a reaped process is still alive (pidfd %v, start time %v)", p.alive(), byStart.alive())
	}
	if _, ok := hostProcOf(cmd.Process.Pid); ok {
		t.Errorf("a reaped process opened as live")
	}
	if _, ok := hostProcOf(0); ok {
		t.Errorf("pid 0 is a process")
	}
}

// The key quota is raised to the minimums, never lowered, and a file that
// is not a number is an error.
func TestRaiseKeyQuota(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b))
	}
	write("maxkeys", "200\n")
	write("maxbytes", "90000000\n")
	if err := raiseKeyQuota(dir, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := read("maxkeys"); got != strconv.Itoa(minMaxKeys) {
		t.Errorf("maxkeys = %s, want %d", got, minMaxKeys)
	}
	if got := read("maxbytes"); got != "90000000" {
		t.Errorf("maxbytes = %s, want the operator's larger 90000000 kept", got)
	}
	write("maxkeys", "lots")
	if err := raiseKeyQuota(dir, slog.New(slog.DiscardHandler)); err == nil {
		t.Errorf("a maxkeys that is not a number passed")
	}
}

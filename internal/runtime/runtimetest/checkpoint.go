package runtimetest

import (
	"context"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// counter keeps its count only in the shell's memory and reports it.
const counter = `i=0; while true; do i=$((i+1)); echo $i > /run/x/count; sleep 0.1; done`

func (e *env) testCheckpointRestore(t *testing.T) {
	ctx := context.Background()
	caps := e.rt.Capabilities(ctx)
	if !caps.Checkpoint {
		// The contract part checked the refusal (CheckpointRefused); here:
		// the refused container's processes did not even notice.
		src := e.start(t, boxOpts{script: counter, hostname: "counter"})
		waitCount(t, src, 3)
		if err := e.rt.Checkpoint(ctx, src.id, filepath.Join(e.base, src.id+"-mem")); !errs.Is(err, errs.FailedPrecondition) {
			t.Fatalf("Checkpoint on a host that cannot: %v, want failed_precondition", err)
		}
		c := count(src)
		waitCount(t, src, c+3) // still running, untouched
		return
	}
	// The hostname is part of the memory image (UTS namespace), so forks
	// keep the original's; the spec must say so to match.
	src := e.start(t, boxOpts{script: counter, hostname: "counter"})
	waitCount(t, src, 5)

	image := filepath.Join(e.base, src.id+"-mem")
	t0 := time.Now()
	if err := e.rt.Checkpoint(ctx, src.id, image); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	t.Logf("%s checkpoint took %v", e.rt.Name(), time.Since(t0))
	if st, err := e.rt.State(ctx, src.id); err == nil && st.State == "running" && st.Pid > 0 {
		if alive := syscall.Kill(st.Pid, 0); alive == nil && e.rt.Name() == "runc" {
			t.Fatalf("runc container still running after Checkpoint: %+v", st)
		}
	}
	if err := e.rt.Delete(ctx, src.id); err != nil {
		t.Fatalf("Delete after Checkpoint: %v", err)
	}
	if _, err := e.rt.State(ctx, src.id); !errs.Is(err, errs.NotFound) {
		t.Fatalf("State after Checkpoint+Delete: %v, want not_found", err)
	}
	time.Sleep(300 * time.Millisecond)
	at := count(src)

	// Restore twice from one image: two independent children (a fork).
	var kids []*box
	for i := 0; i < 2; i++ {
		kid := e.prepare(t, boxOpts{script: counter, hostname: "counter"})
		t0 := time.Now()
		e.run(t, kid, func(ctx context.Context) error { return e.rt.Restore(ctx, kid.spec, image) })
		t.Logf("%s restore #%d took %v", e.rt.Name(), i+1, time.Since(t0))
		kids = append(kids, kid)
	}
	for _, kid := range kids {
		waitCount(t, kid, at+5)
		if first := firstCount(kid); first < at {
			t.Errorf("restored counter started at %d, below %d at checkpoint: memory was not restored", first, at)
		}
		if st, err := e.rt.State(ctx, kid.id); err != nil || st.State != "running" {
			t.Errorf("restored %s: %+v, %v; want running", kid.id, st, err)
		}
	}
	// Independence: stopping one child leaves the other counting.
	if err := e.rt.Delete(ctx, kids[0].id); err != nil {
		t.Fatal(err)
	}
	c := count(kids[1])
	waitCount(t, kids[1], c+3)
	if src.read("count") != strconv.Itoa(at) {
		t.Errorf("the checkpointed source kept counting after Checkpoint")
	}
}

func count(b *box) int {
	n, _ := strconv.Atoi(b.read("count"))
	return n
}

// firstCount is the lowest count a restored box reported: the report file
// is rewritten each tick, so it is the count seen at the first poll.
func firstCount(b *box) int { return b.first }

func waitCount(t *testing.T, b *box, min int) {
	t.Helper()
	waitFor(t, 30*time.Second, func() bool {
		n := count(b)
		if n > 0 && b.first == 0 {
			b.first = n
		}
		return n >= min
	}, func() string {
		return "counter of " + b.id + " at " + b.read("count") + ", want " + strconv.Itoa(min) + "; log: " + b.log()
	})
}

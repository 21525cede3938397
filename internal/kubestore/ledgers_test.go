package kubestore

// Beyond the conformance suite: what a store without transactions must
// still guarantee to concurrent writers (several replicas and nodes write
// one namespace), after an interrupted write, and against hostile keys.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// storeB is the whole store with the row helpers these tests reach
// into: partialB until kstore-a's half lands, then *Store itself (openB,
// in partial_b_test.go until the merge, returns one).
type storeB interface {
	store.Store
	upsert(ctx context.Context, table, key string, seq int64, labels map[string]string, v any) error
	create(ctx context.Context, table, key string, seq int64, labels map[string]string, v any) (*berthv1.Record, error)
	list(ctx context.Context, table string, match map[string]string) ([]row, error)
	nextSeq(ctx context.Context, counter string, n int64) (int64, error)
	writeActivity(ctx context.Context, rows []activityRow, known map[string]bool) error
}

// parallel runs fn(0..n-1) at once and waits.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); fn(i) }()
	}
	wg.Wait()
}

var epochB = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func mkSandbox(t *testing.T, p storeB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := p.CreateSandbox(t.Context(), &sandbox.Sandbox{ID: id, Owner: "alice", State: sandbox.Creating}); err != nil {
			t.Fatal(err)
		}
	}
}

// Concurrent metering steps of one sandbox lose no increment.
func TestUsageConcurrentSteps(t *testing.T) {
	p, ctx := openB(t), t.Context()
	const n = 12
	inc := metering.Usage{CPUSeconds: 1, RunningSeconds: 10}
	errc := make(chan error, n)
	parallel(n, func(i int) {
		errc <- p.RecordUsage(ctx, []store.UsageRecord{{Usage: metering.Usage{SandboxID: "sb", Owner: "alice"},
			Hour: epochB.Add(time.Duration(i) * time.Second), Inc: inc}})
	})
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := p.ListUsage(ctx, store.UsageFilter{SandboxID: "sb"})
	if err != nil || len(got) != 1 || got[0].CPUSeconds != n || got[0].RunningSeconds != 10*n {
		t.Fatalf("ListUsage = %+v, %v; want %d cpu seconds", got, err, n)
	}
}

// An hour bucket left both closed and open by an interrupted hour change
// counts once; the next hour's step then closes it for good.
func TestUsageInterruptedHourChange(t *testing.T) {
	p, ctx := openB(t), t.Context()
	u := metering.Usage{SandboxID: "sb", Owner: "alice"}
	if err := p.RecordUsage(ctx, []store.UsageRecord{{Usage: u, Hour: epochB, Inc: metering.Usage{CPUSeconds: 5}}}); err != nil {
		t.Fatal(err)
	}
	// What the crash leaves: the closed row written, the cursor not moved.
	b := &usageBucket{SandboxID: "sb", Hour: epochB, Owner: "alice", CPUSeconds: 5}
	if err := p.upsert(ctx, tableUsageHour, hourKey("sb", epochB), 0, bucketLabels(b), b); err != nil {
		t.Fatal(err)
	}
	check := func(wantCPU float64, wantHours int) {
		t.Helper()
		got, err := p.ListUsage(ctx, store.UsageFilter{})
		if err != nil || len(got) != 1 || got[0].CPUSeconds != wantCPU {
			t.Fatalf("ListUsage = %+v, %v; want %v cpu seconds", got, err, wantCPU)
		}
		hours, err := p.UsageHours(ctx, store.UsageHoursFilter{})
		if err != nil || len(hours) != wantHours {
			t.Fatalf("UsageHours = %+v, %v; want %d rows", hours, err, wantHours)
		}
	}
	check(5, 1)
	if err := p.RecordUsage(ctx, []store.UsageRecord{{Usage: u, Hour: epochB.Add(time.Hour), Inc: metering.Usage{CPUSeconds: 1}}}); err != nil {
		t.Fatal(err)
	}
	check(6, 2)
	// A late step for the closed hour adds to its row.
	if err := p.RecordUsage(ctx, []store.UsageRecord{{Usage: u, Hour: epochB.Add(time.Minute), Inc: metering.Usage{CPUSeconds: 2}}}); err != nil {
		t.Fatal(err)
	}
	check(8, 2)
}

// Concurrent appenders continuing the audit chain from one head: exactly
// one wins, the others are a Conflict, and the chain has no duplicate.
func TestAuditConcurrentAppend(t *testing.T) {
	p, ctx := openB(t), t.Context()
	const n = 6
	errc := make(chan error, n)
	parallel(n, func(i int) {
		e := store.AuditEntry{Seq: 1, Time: epochB, Action: "api", Hash: "h", PrevHash: "00"}
		errc <- p.AppendAudit(ctx, []store.AuditEntry{e}, store.AuditHead{Seq: 1, Hash: "h"})
	})
	close(errc)
	won := 0
	for err := range errc {
		switch {
		case err == nil:
			won++
		case errs.KindOf(err) != errs.Conflict:
			t.Errorf("a losing append: %v, want Conflict", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d appends of seq 1 succeeded, want 1", won)
	}
	if got, err := p.ListAudit(ctx, store.AuditFilter{}); err != nil || len(got) != 1 {
		t.Fatalf("ListAudit = %+v, %v", got, err)
	}
}

// An append interrupted before its head was written: the rows past the
// head are what AuditLast returns, and appending over them is a Conflict.
func TestAuditInterruptedAppend(t *testing.T) {
	p, ctx := openB(t), t.Context()
	e1 := store.AuditEntry{Seq: 1, Time: epochB, Action: "a", Hash: "h1", PrevHash: "00"}
	if err := p.AppendAudit(ctx, []store.AuditEntry{e1}, store.AuditHead{Seq: 1, Hash: "h1"}); err != nil {
		t.Fatal(err)
	}
	orphan := auditRow{Seq: 2, Time: epochB, Action: "b", Data: "{}", PrevHash: "h1", Hash: "h2"}
	if _, err := p.create(ctx, tableAudit, seqKey(2), 2, nil, orphan); err != nil {
		t.Fatal(err)
	}
	if last, err := p.AuditLast(ctx); err != nil || last.Seq != 2 {
		t.Fatalf("AuditLast = %+v, %v; want the row past the head", last, err)
	}
	e2 := store.AuditEntry{Seq: 2, Time: epochB, Action: "c", Hash: "x2", PrevHash: "h1"}
	if err := p.AppendAudit(ctx, []store.AuditEntry{e2}, store.AuditHead{Seq: 2, Hash: "x2"}); errs.KindOf(err) != errs.Conflict {
		t.Fatalf("append over a row past the head: %v, want Conflict", err)
	}
	if h, _ := p.AuditHead(ctx); h.Seq != 1 {
		t.Errorf("head moved to %d", h.Seq)
	}
}

// Concurrent notes of one sandbox get distinct, consecutive numbers;
// concurrent task writes distinct task numbers and change numbers.
func TestNotesAndTasksConcurrent(t *testing.T) {
	p, ctx := openB(t), t.Context()
	mkSandbox(t, p, "sb")
	const n = 8
	seqs := make([]int64, n)
	errc := make(chan error, 2*n)
	parallel(n, func(i int) {
		nt, err := p.AppendNote(ctx, store.Note{Sandbox: "sb", Owner: "alice", Trigger: "demand"}, 100, 100)
		seqs[i] = nt.Seq
		errc <- err
	})
	parallel(n, func(i int) {
		id := string(rune('a' + i))
		errc <- p.WriteTasks(ctx, store.TaskWrite{Sandbox: "sb", Put: []store.TaskRecord{{ID: id, State: []byte(`{}`)}},
			Changes: []store.TaskChange{{Task: id, Op: "create", Time: epochB}}})
	})
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int64]bool{}
	for _, s := range seqs {
		if s < 1 || s > n || seen[s] {
			t.Fatalf("note seqs %v: want 1..%d once each", seqs, n)
		}
		seen[s] = true
	}
	tasks, err := p.ListTasks(ctx, "sb")
	if err != nil || len(tasks) != n {
		t.Fatalf("ListTasks = %+v, %v", tasks, err)
	}
	changes, err := p.ListTaskChanges(ctx, "sb", "", time.Time{})
	if err != nil || len(changes) != n {
		t.Fatalf("ListTaskChanges = %d, %v", len(changes), err)
	}
	for i := range n {
		if tasks[i].Seq != int64(i+1) || changes[i].Seq != int64(i+1) {
			t.Fatalf("task %d seq %d, change seq %d: want %d, numbers handed out once", i, tasks[i].Seq, changes[i].Seq, i+1)
		}
	}
	// The sandbox's deletion takes all of it.
	if err := p.DeleteSandbox(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	if ns, _ := p.ListNotes(ctx, "sb", 0); len(ns) != 0 {
		t.Errorf("notes left: %d", len(ns))
	}
	if rs, _ := p.list(ctx, tableTaskMeta, nil); len(rs) != 0 {
		t.Errorf("task numbers left: %d rows", len(rs))
	}
}

// Keys a client chooses (an Idempotency-Key, a placeholder) are label
// values only in hashed form: one that would widen a label selector
// ("k,berth.dev/table!=x") selects nothing more than its own rows.
func TestHostileKeys(t *testing.T) {
	p, ctx := openB(t), t.Context()
	mk := func(id, key string) store.Effect {
		return store.Effect{ID: id, Lineage: "lin", SandboxID: "sb", Key: key, Identity: "same", StartedAt: epochB}
	}
	for _, e := range []store.Effect{mk("e1", "k,berth.dev/table!=x"), mk("e2", "k"), mk("e3", string(make([]byte, 300)))} {
		if _, err := p.RecordEffect(ctx, e); err != nil {
			t.Fatalf("RecordEffect(%q): %v", e.Key, err)
		}
	}
	for key, want := range map[string]string{"k,berth.dev/table!=x": "e1", "k": "e2", string(make([]byte, 300)): "e3"} {
		got, err := p.FindEffects(ctx, "lin", key, "", 0)
		if err != nil || len(got) != 1 || got[0].ID != want {
			t.Errorf("FindEffects(%.20q) = %+v, %v; want %s only", key, got, err, want)
		}
	}
	if got, err := p.FindEffects(ctx, "lin", "", "same", 0); err != nil || len(got) != 3 || got[0].ID != "e3" {
		t.Errorf("FindEffects by identity = %+v, %v; want all three, newest first", got, err)
	}
}

// A failing write of a WriteEffects batch that is not its own fault (here
// a row over the size a Kubernetes object may have) leaves nothing of the
// batch behind: the intents written are deleted, the outcome put back.
func TestEffectBatchUndo(t *testing.T) {
	p, ctx := openB(t), t.Context()
	if _, err := p.RecordEffect(ctx, store.Effect{ID: "pre", Lineage: "l", SandboxID: "sb", StartedAt: epochB}); err != nil {
		t.Fatal(err)
	}
	ws := []store.EffectWrite{{ID: "pre", Finish: &store.EffectOutcome{State: store.EffectCompleted, Status: 200}}}
	for i := range 30 {
		ws = append(ws, store.EffectWrite{Record: &store.Effect{ID: "b" + seqKey(int64(i)), Lineage: "l", SandboxID: "sb", StartedAt: epochB}})
	}
	huge := strings.Repeat("x", maxRowBytes)
	ws = append(ws, store.EffectWrite{Record: &store.Effect{ID: "huge", Lineage: "l", SandboxID: "sb", Path: huge, StartedAt: epochB}})
	if res, err := p.WriteEffects(ctx, ws); errs.KindOf(err) != errs.ResourceExhausted {
		t.Fatalf("WriteEffects with an oversized row = %v, %v; want ResourceExhausted for the batch", res, err)
	}
	got, err := p.ListEffects(ctx, store.EffectFilter{SandboxID: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "pre" || got[0].State != store.EffectPending {
		var left []string
		for _, e := range got {
			left = append(left, e.ID+":"+e.State)
		}
		t.Fatalf("after a failed batch: %v, want only the earlier, still pending one", left)
	}
	// Alone, the oversized intent is refused the same way, naming its size.
	if _, err := p.RecordEffect(ctx, store.Effect{ID: "huge", Lineage: "l", SandboxID: "sb", Path: huge}); errs.KindOf(err) != errs.ResourceExhausted {
		t.Errorf("RecordEffect(oversized) = %v, want ResourceExhausted", err)
	}
}

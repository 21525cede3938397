package audit

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type owners map[string]string

func (o owners) SandboxOwner(_ context.Context, id string) (string, error) {
	if v, ok := o[id]; ok {
		return v, nil
	}
	return "", errs.E(errs.NotFound, "no sandbox %s", id)
}

// env is a chain on a real SQLite file with its head file and key.
type env struct {
	t    *testing.T
	dir  string
	st   *store.SQLite
	svc  *Service
	stop func()
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

func newEnv(t *testing.T) *env {
	e := &env{t: t, dir: t.TempDir()}
	e.start()
	t.Cleanup(func() { e.close() })
	return e
}

func (e *env) start() {
	st, err := store.OpenSQLite(filepath.Join(e.dir, "berth.db"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.st = st
	e.svc = New(Config{Key: testKey, HeadPath: filepath.Join(e.dir, HeadFile)}, owners{"sb1": "alice", "sb2": "bob"}, st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.svc.Run(ctx) }()
	e.stop = func() { cancel(); <-done }
}

func (e *env) close() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
	if e.st != nil {
		e.st.Close()
		e.st = nil
	}
}

func (e *env) restart() {
	e.close()
	e.start()
}

// fill records n entries and waits for them to be stored.
func (e *env) fill(n int) {
	for i := range n {
		sb := []string{"sb1", "sb2", ""}[i%3]
		e.svc.Audit(context.Background(), "alice", "test.step", sb, map[string]string{"i": fmt.Sprint(i)})
	}
	if err := e.svc.Flush(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
}

// sql runs statements on the stopped chain's database, as a person with
// the sqlite3 tool would (the append-only triggers dropped first).
func (e *env) sql(stmts ...string) {
	e.close()
	db, err := sql.Open("sqlite", filepath.Join(e.dir, "berth.db"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer db.Close()
	for _, s := range append([]string{`DROP TRIGGER IF EXISTS audit_append_only_update`, `DROP TRIGGER IF EXISTS audit_append_only_delete`}, stmts...) {
		if _, err := db.Exec(s); err != nil {
			e.t.Fatalf("%s: %v", s, err)
		}
	}
}

// verify reopens the store (no writer: Run would record what it finds at
// start) and verifies.
func (e *env) verify() Report {
	e.close()
	st, err := store.OpenSQLite(filepath.Join(e.dir, "berth.db"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer st.Close()
	svc := New(Config{Key: testKey, HeadPath: filepath.Join(e.dir, HeadFile)}, owners{}, st)
	r, err := svc.Verify(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func TestChainIntact(t *testing.T) {
	e := newEnv(t)
	e.fill(24)
	e.restart() // the chain continues across a restart
	e.fill(6)
	rows, err := e.st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 30 {
		t.Fatalf("%d rows, want 30", len(rows))
	}
	for i, r := range rows {
		if r.Seq != int64(i+1) {
			t.Fatalf("row %d has seq %d", i, r.Seq)
		}
		want := map[int]string{0: "alice", 1: "bob", 2: ""}[i%3]
		if r.Owner != want || r.Actor != "alice" || r.Action != "test.step" {
			t.Errorf("seq %d: owner %q actor %q action %q, want owner %q (resolved from its sandbox)", r.Seq, r.Owner, r.Actor, r.Action, want)
		}
	}
	r := e.verify()
	if !r.OK() || r.Entries != 30 || r.LastSeq != 30 || r.HeadSeq != 30 || r.FileSeq != 30 {
		t.Fatalf("verify of an intact chain = %+v", r)
	}
}

// TestVerifyCatches: every kind of edit of the stored chain is reported,
// naming the seq it concerns.
func TestVerifyCatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  []string
		files func(dir string) // an edit of the head file
		kind  string
		seq   int64
	}{
		{name: "edited field", edit: []string{`UPDATE audit SET actor = 'mallory' WHERE seq = 7`}, kind: ProblemChanged, seq: 7},
		{name: "edited data", edit: []string{`UPDATE audit SET data = '{"i":"99"}' WHERE seq = 4`}, kind: ProblemChanged, seq: 4},
		{name: "data not json", edit: []string{`UPDATE audit SET data = 'x' WHERE seq = 4`}, kind: ProblemChanged, seq: 4},
		{name: "recomputed hash", edit: nil, kind: ProblemChanged, seq: 5}, // filled below
		{name: "deleted middle row", edit: []string{`DELETE FROM audit WHERE seq = 10`}, kind: ProblemRemoved, seq: 10},
		{name: "two rows swapped", edit: []string{
			`UPDATE audit SET seq = -1 WHERE seq = 12`,
			`UPDATE audit SET seq = 12 WHERE seq = 13`,
			`UPDATE audit SET seq = 13 WHERE seq = -1`,
		}, kind: ProblemChanged, seq: 12},
		{name: "deleted tail", edit: []string{`DELETE FROM audit WHERE seq > 16`}, kind: ProblemTruncated, seq: 17},
		{name: "deleted tail and head moved back", edit: []string{
			`DELETE FROM audit WHERE seq > 16`,
			`UPDATE audit_head SET seq = 16, hash = (SELECT hash FROM audit WHERE seq = 16)`,
		}, kind: ProblemHead, seq: 16},
		{name: "edited head", edit: []string{`UPDATE audit_head SET mac = 'ff' || substr(mac, 3)`}, kind: ProblemHead, seq: 20},
		{name: "head row deleted", edit: []string{`DELETE FROM audit_head`}, kind: ProblemHead, seq: 20},
		{name: "head file removed", files: func(dir string) { os.Remove(filepath.Join(dir, HeadFile)) }, kind: ProblemHead, seq: 20},
		{name: "head file edited", files: func(dir string) {
			p := filepath.Join(dir, HeadFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), `"seq":20`, `"seq":19`, 1)), 0o600)
		}, kind: ProblemHead, seq: 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.fill(20)
			edit := tc.edit
			if tc.name == "recomputed hash" {
				// Without the key, a consistent re-hash still fails the MAC.
				rows, _ := e.st.ListAudit(t.Context(), store.AuditFilter{AfterSeq: 4, Limit: 1})
				row := rows[0]
				row.Actor = "mallory"
				edit = []string{fmt.Sprintf(`UPDATE audit SET actor = 'mallory', hash = '%s' WHERE seq = 5`, Hash(row.PrevHash, row))}
			}
			e.sql(edit...)
			if tc.files != nil {
				tc.files(e.dir)
			}
			r := e.verify()
			if r.OK() {
				t.Fatalf("verify passed after the edit: %+v", r)
			}
			found := false
			for _, p := range r.Problems {
				if p.Kind == tc.kind && p.Seq == tc.seq {
					found = true
				}
			}
			if !found {
				t.Fatalf("problems = %+v, want a %q problem at seq %d", r.Problems, tc.kind, tc.seq)
			}
		})
	}
}

// TestRestartRecordsMismatch: a daemon that starts on a truncated chain
// records the finding in the chain, so appending after it cannot hide it.
func TestRestartRecordsMismatch(t *testing.T) {
	e := newEnv(t)
	e.fill(10)
	e.sql(`DELETE FROM audit WHERE seq > 8`)
	e.start()
	e.fill(3)
	rows, err := e.st.ListAudit(t.Context(), store.AuditFilter{AfterSeq: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || rows[0].Action != ActionMismatch || rows[0].Seq != 9 {
		t.Fatalf("entries after the truncation = %+v, want an %s entry at seq 9 then 3", rows, ActionMismatch)
	}
	r := e.verify()
	if r.OK() || len(r.Problems) != 1 || r.Problems[0].Kind != ProblemRecorded || r.Problems[0].Seq != 9 {
		t.Fatalf("verify = %+v, want exactly the recorded mismatch at seq 9", r)
	}
}

// TestHeadFileLagAccepted: a crash between the commit and the head file
// leaves the file one batch behind; that is not tampering.
func TestHeadFileLagAccepted(t *testing.T) {
	e := newEnv(t)
	e.fill(5)
	p := filepath.Join(e.dir, HeadFile)
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	e.fill(5)
	e.close()
	if err := os.WriteFile(p, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.verify(); !r.OK() || r.FileSeq != 5 || r.HeadSeq != 10 {
		t.Fatalf("verify with the head file one batch behind = %+v, want OK", r)
	}
	e.start() // brings the file up to date
	e.close()
	if r := e.verify(); !r.OK() || r.FileSeq != 10 {
		t.Fatalf("verify after a restart = %+v, want the file at seq 10", r)
	}
}

// TestFullQueueRecordsDrops: entries that find the queue full are counted
// into an audit.dropped entry.
func TestFullQueueRecordsDrops(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := New(Config{Key: testKey, Queue: 4}, owners{}, st)
	for i := range 10 { // the writer is not running: 4 fit, 6 are dropped
		svc.Audit(t.Context(), "a", "x", "", map[string]string{"i": fmt.Sprint(i)})
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	if err := svc.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	rows, err := st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 5 || rows[4].Action != ActionDropped || rows[4].Data["count"] != "6" {
		t.Fatalf("rows = %+v, want 4 entries and an %s entry with count 6", rows, ActionDropped)
	}
}

// TestBounds: what a sandbox can send (argv, data) is clipped, keeps valid
// UTF-8 (so the stored row hashes as written) and still verifies.
func TestBounds(t *testing.T) {
	e := newEnv(t)
	big := map[string]string{"bad": "a\xffb", "long": strings.Repeat("é", 4000)}
	for i := range 100 {
		big[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 200)
	}
	e.svc.Audit(t.Context(), strings.Repeat("x", 1000), "test.big", "sb1", big)
	if err := e.svc.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	rows, err := e.st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	r := rows[0]
	size := 0
	for k, v := range r.Data {
		size += len(k) + len(v)
	}
	if len(r.Data) > MaxKeys || size > MaxData+16 || len(r.Actor) > MaxField || r.Data["clipped"] == "" || r.Data["bad"] != "a\uFFFDb" {
		t.Fatalf("entry not bounded: %d keys, %d bytes, actor %d bytes, clipped %q, bad %q", len(r.Data), size, len(r.Actor), r.Data["clipped"], r.Data["bad"])
	}
	if rep := e.verify(); !rep.OK() {
		t.Fatalf("verify = %+v", rep)
	}
}

func TestLifecycleHook(t *testing.T) {
	e := newEnv(t)
	var bus statehook.Bus
	bus.Register("audit", e.svc)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	child := &sandbox.Sandbox{ID: "sb2", Owner: "bob", State: sandbox.Running}
	child.Attrs.Lineage.Parent = "sb1"
	_ = bus.Fire(t.Context(), statehook.Event{Phase: statehook.Forked, Sandbox: child, From: "sb1", Actor: "bob", PointAt: at})
	_ = bus.Fire(t.Context(), statehook.Event{Phase: statehook.Paused, Sandbox: &sandbox.Sandbox{ID: "sb1", Owner: "alice",
		PauseActual: sandbox.PauseDisk, PauseRequested: sandbox.PauseMemory}})
	if err := e.svc.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	rows, _ := e.st.ListAudit(t.Context(), store.AuditFilter{})
	if len(rows) != 2 || rows[0].Action != "sandbox.forked" || rows[0].Data["from"] != "sb1" || rows[0].Data["parent"] != "sb1" ||
		rows[0].Owner != "bob" || rows[0].Actor != "bob" || rows[1].Action != "sandbox.paused" || rows[1].Actor != "berth" ||
		rows[1].Data["mode"] != "disk" || rows[1].Data["requested"] != "memory" {
		t.Fatalf("rows = %+v", rows)
	}
}

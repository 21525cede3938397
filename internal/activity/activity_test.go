package activity

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// storeCore is the lifecycle core's Visible over a real store.
type storeCore struct{ st store.Store }

func (c storeCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if owner != "" && sb.Owner != owner {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

// setup opens a real SQLite store with sandbox "a" of alice.
func setup(t *testing.T, cfg Config) (*Service, store.Store) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, id := range []string{"a", "b"} {
		if err := st.CreateSandbox(t.Context(), &sandbox.Sandbox{ID: id, Owner: "alice", Template: "tiny", Runtime: "runc",
			State: sandbox.Creating, ExpiryAction: sandbox.ExpireStop}); err != nil {
			t.Fatal(err)
		}
	}
	return New(cfg, storeCore{st}, st), st
}

// run starts the writer until the test ends.
func run(t *testing.T, s *Service) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func list(t *testing.T, s *Service, id string, q Query) []wire.ActivityEntry {
	t.Helper()
	l, err := s.List(t.Context(), "alice", id, q)
	if err != nil {
		t.Fatal(err)
	}
	return l.Entries
}

func waitEntries(t *testing.T, s *Service, id string, q Query, n int) []wire.ActivityEntry {
	t.Helper()
	var got []wire.ActivityEntry
	testutil.Eventually(t, testutil.Within(5*time.Second), func() error {
		if got = list(t, s, id, q); len(got) < n {
			return fmt.Errorf("%d entries, want %d: %+v", len(got), n, got)
		}
		return nil
	})
	return got
}

func TestExecTraces(t *testing.T) {
	s, _ := setup(t, Config{})
	run(t, s)
	o := s.Observer("a")

	ok := o.Exec(agentapi.ExecRequest{Argv: []string{"sh", "-c", "cat; exit 3"}, User: "root", Cwd: "/tmp", Stdin: true})
	ok.Event(&agentapi.Event{Type: "start", Pid: 42})
	o.Input(42, 5)
	o.Input(99, 1000) // another process: not counted here
	ok.Event(&agentapi.Event{Type: "stdout", Data: []byte("hello")})
	ok.Event(&agentapi.Event{Type: "stderr", Data: []byte("!!")})
	ok.Event(&agentapi.Event{Type: "exit", ExitCode: 3, Exited: true})
	ok.Closed() // the stream's Close after its exit: recorded once

	killed := o.Exec(agentapi.ExecRequest{Shell: "sleep 100"})
	killed.Event(&agentapi.Event{Type: "start", Pid: 43})
	killed.Event(&agentapi.Event{Type: "exit", ExitCode: -1, Signal: "killed"})

	detached := o.Exec(agentapi.ExecRequest{Argv: []string{"server"}})
	detached.Event(&agentapi.Event{Type: "start", Pid: 44})
	detached.Closed()

	o.FileChanged("write", "/home/user/x.txt", "", 12)
	o.FileChanged("move", "/a", "/b", 0)

	got := waitEntries(t, s, "a", Query{Kinds: []string{KindExec, KindFile}}, 5)
	three := 3
	want := []Data{
		{Argv: []string{"sh", "-c", "cat; exit 3"}, User: "root", Cwd: "/tmp", ExitCode: &three, Pid: 42, BytesIn: 5, BytesOut: 7},
		{Argv: []string{"/bin/sh", "-c", "sleep 100"}, Signal: "killed", Pid: 43},
		{Argv: []string{"server"}, Pid: 44, Detached: true},
		{Op: "write", Path: "/home/user/x.txt", Size: 12, Source: "api"},
		{Op: "move", Path: "/a", To: "/b", Source: "api"},
	}
	var gotData []Data
	for i, e := range got {
		d := e.Data
		if e.Kind == KindExec {
			if d.Started.IsZero() || d.Ended.Before(d.Started) {
				t.Errorf("entry %d: started %v ended %v", i, d.Started, d.Ended)
			}
			d.Started, d.Ended = time.Time{}, time.Time{}
		}
		if e.Actor != "api" || e.Summary == "" {
			t.Errorf("entry %d: actor %q summary %q", i, e.Actor, e.Summary)
		}
		gotData = append(gotData, d)
	}
	if d := cmp.Diff(want, gotData); d != "" {
		t.Errorf("recorded entries (-want +got):\n%s", d)
	}
	if !strings.Contains(got[0].Summary, "exit 3") || !strings.Contains(got[1].Summary, "signal killed") {
		t.Errorf("summaries: %q, %q", got[0].Summary, got[1].Summary)
	}
	s.mu.Lock()
	live := len(s.live)
	s.mu.Unlock()
	if live != 0 {
		t.Errorf("%d execs still tracked after they ended", live)
	}
}

// A full queue never blocks Record: the overflow is counted and becomes
// one "dropped" entry of its sandbox.
func TestQueueFullDropsAndCounts(t *testing.T) {
	s, _ := setup(t, Config{Queue: 4})
	start := time.Now()
	for i := range 10 {
		s.Record("a", KindFile, "api", time.Now(), Data{Op: "write", Path: "/f" + string(rune('0'+i))})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("10 Records without a writer took %v: Record must not block", d)
	}
	run(t, s)
	got := waitEntries(t, s, "a", Query{}, 5)
	var files, dropped int64
	for _, e := range got {
		switch e.Kind {
		case KindFile:
			files++
		case KindDropped:
			dropped += e.Data.Dropped
		}
	}
	if files != 4 || dropped != 6 {
		t.Errorf("files %d, dropped %d; want 4 written and 6 counted as dropped: %+v", files, dropped, got)
	}
}

// The writer keeps each sandbox's newest Retention entries, whoever
// wrote them (recorded entries and the store's own lifecycle rows).
func TestRetentionPrunes(t *testing.T) {
	s, st := setup(t, Config{Retention: 5})
	run(t, s)
	for i := range 50 {
		s.Record("a", KindExec, "api", time.Now(), Data{Argv: []string{"n", string(rune('a' + i%26))}, Pid: i + 1})
	}
	s.Record("b", KindExec, "api", time.Now(), Data{Pid: 1})
	testutil.Eventually(t, testutil.Within(5*time.Second), func() error {
		if got := list(t, s, "a", Query{}); len(got) == 0 || got[len(got)-1].Data.Pid != 50 {
			return fmt.Errorf("the last exec is not written yet")
		}
		return nil
	})
	if _, err := st.Transition(t.Context(), "a", sandbox.Running, sandbox.Event{Actor: "alice", Reason: "created"}, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(5*time.Second), func() error {
		got := list(t, s, "a", Query{})
		if len(got) != 5 || got[4].Kind != KindLifecycle || got[3].Data.Pid != 50 {
			return fmt.Errorf("entries %+v, want the newest 5 (the last exec, then the lifecycle event)", got)
		}
		return nil
	})
	if got := list(t, s, "b", Query{}); len(got) != 1 {
		t.Errorf("b has %d entries, want its 1 (pruning is per sandbox)", len(got))
	}
}

func TestFollowSeesNewEntriesAndEndsOnDelete(t *testing.T) {
	s, st := setup(t, Config{})
	run(t, s)
	s.Record("a", KindFile, "api", time.Now(), Data{Op: "write", Path: "/old"})
	waitEntries(t, s, "a", Query{}, 1)

	if err := s.Follow(t.Context(), "bob", "a", Query{}, func(wire.ActivityEntry) error { return nil }, nil); errs.KindOf(err) != errs.NotFound {
		t.Fatalf("Follow by another owner: %v, want NotFound", err)
	}
	got := make(chan wire.ActivityEntry, 16)
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(context.Background(), "alice", "a", Query{}, func(e wire.ActivityEntry) error { got <- e; return nil }, nil)
	}()
	if e := <-got; e.Data.Path != "/old" {
		t.Fatalf("first followed entry = %+v, want the backlog", e)
	}
	sent := time.Now()
	s.Record("a", KindExec, "api", time.Now(), Data{Argv: []string{"new"}})
	select {
	case e := <-got:
		if len(e.Data.Argv) != 1 || e.Data.Argv[0] != "new" {
			t.Fatalf("followed %+v, want the new exec", e)
		}
		t.Logf("a new entry reached the follower in %v", time.Since(sent))
	case <-time.After(2 * time.Second):
		t.Fatal("the follower did not see a new entry within 2s")
	}
	if err := st.DeleteSandbox(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Follow ended with %v, want nil on deletion", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not end after the sandbox was deleted")
	}
}

func TestQueryValidate(t *testing.T) {
	for _, tc := range []struct {
		q     Query
		field string
	}{
		{Query{}, ""},
		{Query{After: -1}, "after"},
		{Query{Limit: MaxLimit + 1}, "limit"},
		{Query{Kinds: []string{"exec", "nope"}}, "kind"},
	} {
		err := tc.q.Validate()
		if got := errs.FieldOf(err); got != tc.field {
			t.Errorf("%+v: field %q (%v), want %q", tc.q, got, err, tc.field)
		}
	}
	q := Query{}
	_ = q.Validate()
	if q.Limit != DefaultLimit {
		t.Errorf("default limit %d", q.Limit)
	}
}

func TestSummarize(t *testing.T) {
	zero, three := 0, 3
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		kind string
		d    Data
		want string
	}{
		{KindExec, Data{Argv: []string{"ls", "-l"}, ExitCode: &zero, Started: t0, Ended: t0.Add(1500 * time.Millisecond)}, "$ ls -l → exit 0 in 1.5s"},
		{KindExec, Data{Argv: []string{"false"}, ExitCode: &three}, "$ false → exit 3"},
		{KindExec, Data{Argv: []string{"sleep", "9"}, Signal: "killed"}, "$ sleep 9 → signal killed"},
		{KindExec, Data{Argv: []string{"srv"}, Detached: true}, "$ srv (detached, still running?)"},
		{KindFile, Data{Op: "write", Path: "/a", Size: 3, Source: "api"}, "write /a (3 bytes)"},
		{KindFile, Data{Op: "write", Path: "/w", Source: "workspace", More: 9}, "write /w [workspace] and 9 more changes"},
		{KindEgress, Data{Verdict: "deny", Proto: "tcp", Host: "evil.test", DstPort: 443, Rule: "default-deny"}, "deny tcp evil.test:443 (default-deny)"},
		{KindPause, Data{Mode: "disk", Requested: "memory", Message: "criu failed"}, "paused (disk, memory requested): criu failed"},
		{KindResume, Data{ResumedFrom: "freeze"}, "resumed from freeze"},
		{KindReaper, Data{Reason: "idle", Attrs: map[string]string{"action": "pause"}}, "reaper: pause (idle)"},
		{KindDropped, Data{Dropped: 7}, "7 activity entries dropped (recorder queue full)"},
		{KindLifecycle, Data{Event: "transition", FromState: "creating", ToState: "running", Reason: "created"}, "creating → running (created)"},
		{KindLifecycle, Data{Event: "oom", Message: "a\nb"}, "oom: a b"},
	} {
		if got := Summarize(tc.kind, tc.d); got != tc.want {
			t.Errorf("Summarize(%s, %+v) = %q, want %q", tc.kind, tc.d, got, tc.want)
		}
	}
	long := Summarize(KindFile, Data{Op: "write", Path: "/" + strings.Repeat("é", 500)})
	if len(long) > maxLine+len("…") || !strings.HasSuffix(long, "…") {
		t.Errorf("long summary not clipped: %d bytes", len(long))
	}
	argv := clipArgv(make([]string, 100))
	if len(argv) != maxArgv+1 || argv[maxArgv] != "… 36 more" {
		t.Errorf("clipArgv(100 args) = %d args, last %q", len(argv), argv[len(argv)-1])
	}
}

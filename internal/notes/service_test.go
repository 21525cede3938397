package notes

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dirCore is a Core over plain directories: an upper and a template
// layer per sandbox, no agent (so no git and no processes).
type dirCore struct {
	st    store.Store
	roots map[string][2]string // id → upper, template
}

func (c dirCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, id)
	if err != nil || owner != "" && sb.Owner != owner {
		return nil, errs.E(errs.NotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

func (c dirCore) Agent(*sandbox.Sandbox) *agentapi.Client { return nil }

func (c dirCore) Tree(_ context.Context, sb *sandbox.Sandbox) (*fsdiff.Tree, int, func() error, error) {
	r := c.roots[sb.ID]
	up, err := fsdiff.OpenDirLayer(r[0], "upper:"+sb.ID, nil)
	if err != nil {
		return nil, 0, nil, err
	}
	tpl, err := fsdiff.OpenDirLayer(r[1], "tpl", nil)
	if err != nil {
		up.Close()
		return nil, 0, nil, err
	}
	return fsdiff.NewTree(up, tpl), 1, func() error { up.Close(); return tpl.Close() }, nil
}

func write(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestServiceNotes(t *testing.T) {
	ctx := t.Context()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tpl, upA, upB := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, tpl, "etc/motd", "hello")
	write(t, tpl, "repo/.git/HEAD", "ref: refs/heads/main\n") // a template repository
	write(t, tpl, "repo/src/main.go", "package main\n")
	core := dirCore{st: st, roots: map[string][2]string{"a": {upA, tpl}, "b": {upB, tpl}}}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	s := New(core, st, Config{Now: clock})
	for _, id := range []string{"a", "b"} {
		if err := st.CreateSandbox(ctx, &sandbox.Sandbox{ID: id, Owner: "alice", Template: "t", TemplateID: "f", Runtime: "runc",
			State: sandbox.Running, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	// First note: against the template. The template repository edited
	// in the sandbox is found above the changed file; a .git symlink is
	// listed, never followed.
	write(t, upA, "repo/src/main.go", "package main // edited\n")
	write(t, upA, "work/new.txt", "new")
	if err := os.MkdirAll(filepath.Join(upA, "evil"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(upA, "evil", ".git")); err != nil {
		t.Fatal(err)
	}
	n1, err := s.Write(ctx, WriteRequest{Owner: "alice", Sandbox: "a", Actor: "alice", Supplied: Supplied{Reason: "lunch", Next: "tests", ContextVersion: "v1"}})
	if err != nil {
		t.Fatal(err)
	}
	ch := map[string]string{}
	for _, c := range n1.Files.Changes {
		ch[c.Path] = c.Kind
	}
	if ch["repo/src/main.go"] != "modified" || ch["work/new.txt"] != "added" || ch["evil/.git"] != "added" || n1.Files.Total != 3 {
		t.Errorf("first note's files = %v (total %d)", ch, n1.Files.Total)
	}
	if n1.ReposTotal != 2 || n1.GitError != "no agent channel" {
		t.Errorf("repositories: %d found (%+v), git error %q", n1.ReposTotal, n1.Repos, n1.GitError)
	}
	// The pause note: only what changed since, the agent's fields carried.
	write(t, upA, "work/new.txt", "newer")
	if err := s.OnState(ctx, statehook.Event{Phase: statehook.BeforePause, Sandbox: mustGet(t, st, "a"), Actor: "reaper"}); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Latest(ctx, "alice", "a")
	if err != nil || cur.Note == nil {
		t.Fatal(cur, err)
	}
	p := cur.Note
	if p.Trigger != TriggerPause || p.Files.SinceSeq != n1.Seq || p.Files.Total != 1 || p.Files.Changes[0].Path != "work/new.txt" ||
		p.Files.Changes[0].Kind != "modified" || p.Next != "tests" || p.ContextVersion != "v1" || p.Reason != "" {
		t.Errorf("pause note: %+v", p)
	}
	// Another owner sees nothing.
	if _, err := s.Latest(ctx, "bob", "a"); !errs.Is(err, errs.NotFound) {
		t.Errorf("bob reads alice's note: %v", err)
	}
	// The agent declares v2; a fork inherits; a restore to before v2
	// returns n1 with a desync.
	if _, err := s.Write(ctx, WriteRequest{Owner: "alice", Sandbox: "a", Actor: "alice", Supplied: Supplied{ContextVersion: "v2"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.OnState(ctx, statehook.Event{Phase: statehook.Forked, Sandbox: mustGet(t, st, "b"), From: "a"}); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Latest(ctx, "", "b"); c.Note == nil || c.Note.Inherited == nil || c.Note.Inherited.Sandbox != "a" || c.Note.ContextVersion != "v2" {
		t.Errorf("fork child's note: %+v", c.Note)
	}
	if err := s.OnState(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: mustGet(t, st, "a"), From: "a",
		Checkpoint: "c1", PointAt: n1.CreatedAt.Add(500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	c, _ := s.Latest(ctx, "", "a")
	if c.Note == nil || c.Note.Restored == nil || c.Note.Restored.Seq != n1.Seq || c.Note.ContextVersion != "v1" ||
		c.Desync == nil || c.Desync.AgentVersion != "v2" || c.Desync.MachineVersion != "v1" || len(c.Note.Warnings) == 0 {
		t.Errorf("after restore: %+v desync %+v", c.Note, c.Desync)
	}
	// Bounds of what the agent supplies.
	if _, err := s.Write(ctx, WriteRequest{Owner: "alice", Sandbox: "a", Actor: "x", Supplied: Supplied{Unfinished: string(make([]byte, MaxField+1))}}); errs.FieldOf(err) != "unfinished" {
		t.Errorf("oversized field: %v", err)
	}
	// Demand notes are rate-limited per sandbox: a burst, then refused.
	refused := 0
	for range demandBurst + 10 {
		if _, err := s.Write(ctx, WriteRequest{Owner: "alice", Sandbox: "b", Actor: "x", FromSandbox: true}); errs.Is(err, errs.ResourceExhausted) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if refused == 0 {
		t.Errorf("%d demand notes in a row were all written", demandBurst+10)
	}
	// Retention: at most Retained notes. (The operator's own writes are
	// not rate-limited: 105 in a row.)
	for range Retained + 5 {
		if _, err := s.Write(ctx, WriteRequest{Owner: "alice", Sandbox: "b", Actor: "x", Supplied: Supplied{}}); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := s.List(ctx, "alice", "b"); len(list) != Retained {
		t.Errorf("%d notes kept, want %d", len(list), Retained)
	}
}

func mustGet(t *testing.T, st store.Store, id string) *sandbox.Sandbox {
	t.Helper()
	sb, err := st.GetSandbox(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestBucket(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var b bucket
	ok := true
	n := 0
	for ok {
		if b, ok = b.take(t0); ok {
			n++
		}
	}
	if n != demandBurst {
		t.Fatalf("burst = %d, want %d", n, demandBurst)
	}
	if _, ok := b.take(t0.Add(demandEvery / 2)); ok {
		t.Error("a token half a refill later")
	}
	if b, ok = b.take(t0.Add(demandEvery)); !ok {
		t.Error("no token one refill later")
	}
	if _, ok := b.take(t0.Add(demandEvery)); ok {
		t.Error("two tokens from one refill")
	}
	if b, _ = b.take(t0.Add(100 * demandEvery)); b.tokens != demandBurst-1 {
		t.Errorf("tokens after a long wait = %v, want the burst minus one", b.tokens)
	}
}

// TestPauseDoesNotWaitBehindANote: a pause's note waits for the note lock
// no longer than its budget.
func TestPauseDoesNotWaitBehindANote(t *testing.T) {
	ctx := t.Context()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := New(dirCore{st: st}, st, Config{Budget: 100 * time.Millisecond})
	unlock, err := s.lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.OnState(ctx, statehook.Event{Phase: statehook.BeforePause, Sandbox: &sandbox.Sandbox{ID: "x", Owner: "o", State: sandbox.Running}})
	if !errs.Is(err, errs.Unavailable) || time.Since(start) > 5*time.Second {
		t.Fatalf("OnState behind a held lock = %v after %s, want Unavailable after the budget", err, time.Since(start))
	}
	unlock()
	if len(s.locks) != 0 {
		t.Errorf("%d lock entries left", len(s.locks))
	}
}

package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// nextMatching reads watch events until one satisfies pred, failing on
// any event for which bad is true.
func nextMatching(t *testing.T, w *agentapi.WatchStream, pred, bad func(agentapi.FSEvent) bool) agentapi.FSEvent {
	t.Helper()
	var seen []agentapi.FSEvent
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("waiting (seen %+v): %v", seen, err)
		}
		if bad != nil && bad(ev) {
			t.Fatalf("unexpected event %+v (seen %+v)", ev, seen)
		}
		if pred(ev) {
			return ev
		}
		seen = append(seen, ev)
	}
}

// TestWatchReplaceEntryCatchUp: a file the agent replaces atomically shows
// as E2B's in-place write (create+write when new, write when it existed),
// and its temporary file never shows; IncludeEntry attaches the entry
// (not to removes); a directory tree made faster than the agent can add
// watches is still reported.
func TestWatchReplaceEntryCatchUp(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	dir := filepath.Join(e.home, "r")
	mustMkdir(t, dir)
	w, err := e.client.Watch(ctx, agentapi.WatchRequest{Path: "r", Recursive: true, IncludeEntry: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	noTemp := func(ev agentapi.FSEvent) bool { return strings.Contains(ev.Name, ".berth-") }
	nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Type == "start" }, nil)
	if _, err := e.client.WriteFile(ctx, "r/a.txt", "", 0, strings.NewReader("one")); err != nil {
		t.Fatal(err)
	}
	ev := nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Name == "a.txt" }, noTemp)
	if ev.Type != "create" || ev.Entry == nil || ev.Entry.Type != "file" || ev.Entry.Path != filepath.Join(dir, "a.txt") {
		t.Fatalf("first event for a new file = %+v (entry %+v), want create with its entry", ev, ev.Entry)
	}
	ev = nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Name == "a.txt" }, noTemp)
	if ev.Type != "write" || ev.Entry == nil || ev.Entry.Size != 3 {
		t.Fatalf("second event = %+v (entry %+v), want write of 3 bytes", ev, ev.Entry)
	}
	if _, err := e.client.WriteFile(ctx, "r/a.txt", "", 0, strings.NewReader("second")); err != nil {
		t.Fatal(err)
	}
	ev = nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Name == "a.txt" }, noTemp)
	if ev.Type != "write" || ev.Entry == nil || ev.Entry.Size != 6 {
		t.Fatalf("replacing an existing file = %+v (entry %+v), want write of 6 bytes", ev, ev.Entry)
	}
	// A tree made in one go, below the watch.
	deep := filepath.Join(dir, "x", "y", "z")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(deep, "f"), "data")
	nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Name == "x/y/z/f" && ev.Type == "write" }, noTemp)
	if err := os.Remove(filepath.Join(dir, "a.txt")); err != nil {
		t.Fatal(err)
	}
	ev = nextMatching(t, w, func(ev agentapi.FSEvent) bool { return ev.Name == "a.txt" && ev.Type == "remove" }, noTemp)
	if ev.Entry != nil {
		t.Fatalf("remove carries an entry: %+v", ev.Entry)
	}
}

// waitFor reads watch events until want is seen.
func waitFor(t *testing.T, w *agentapi.WatchStream, want agentapi.FSEvent) {
	t.Helper()
	var seen []agentapi.FSEvent
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("waiting for %+v (seen %+v): %v", want, seen, err)
		}
		if ev == want {
			return
		}
		seen = append(seen, ev)
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	dir := filepath.Join(e.home, "w")
	mustMkdir(t, dir)
	w, err := e.client.Watch(ctx, agentapi.WatchRequest{Path: "w", Recursive: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first, err := w.Next()
	if err != nil || first != (agentapi.FSEvent{Type: "start"}) {
		t.Fatalf("first = %+v, %v", first, err)
	}
	if _, err := e.client.WriteFile(ctx, "w/a.txt", "", 0, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w, agentapi.FSEvent{Type: "create", Name: "a.txt"}) // the temp file is renamed over it
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("more"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w, agentapi.FSEvent{Type: "write", Name: "a.txt"})
	mustMkdir(t, filepath.Join(dir, "sub"))
	waitFor(t, w, agentapi.FSEvent{Type: "create", Name: "sub"})
	time.Sleep(50 * time.Millisecond) // the agent adds the new directory's watch
	writeFile(t, filepath.Join(dir, "sub", "deep"), "x")
	waitFor(t, w, agentapi.FSEvent{Type: "create", Name: "sub/deep"})
	if err := os.Remove(filepath.Join(dir, "a.txt")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w, agentapi.FSEvent{Type: "remove", Name: "a.txt"})
}

func TestWatchKeepaliveAndErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	w, err := e.client.Watch(ctx, agentapi.WatchRequest{Path: "~"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitFor(t, w, agentapi.FSEvent{Type: "start"})
	waitFor(t, w, agentapi.FSEvent{Type: "keepalive"})
	writeFile(t, filepath.Join(e.home, "f"), "x")
	_, err = e.client.Watch(ctx, agentapi.WatchRequest{Path: "missing"}, 0)
	wantErr(t, err, errs.NotFound, "missing")
	_, err = e.client.Watch(ctx, agentapi.WatchRequest{Path: "f"}, 0)
	wantErr(t, err, errs.InvalidArgument, "not a directory")
}

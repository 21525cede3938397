package agent_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

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

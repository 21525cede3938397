package checkpoint

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// testCore is the lifecycle core as the unit tests need it: a real store,
// a sandbox dir and a fixed clock. The rest of Core is left unimplemented
// (a call panics): these tests never boot, restore or touch a runtime.
type testCore struct {
	Core
	st  store.Store
	dir string
	now time.Time
}

func (c *testCore) Store() store.Store          { return c.st }
func (c *testCore) Now() time.Time              { return c.now }
func (c *testCore) SandboxDir(id string) string { return filepath.Join(c.dir, "sandboxes", id) }
func (c *testCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	ev := sandbox.Event{SandboxID: sb.ID, Owner: sb.Owner, Time: c.now, Actor: actor, Type: typ, Reason: reason, Message: msg, Data: data}
	if _, err := c.st.AppendEvent(context.WithoutCancel(ctx), ev); err != nil {
		panic(err)
	}
}

// openStore opens a real SQLite store for one test, closed after it.
func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/store"
)

// e2bKeyRe is the check current E2B SDKs apply to a key before sending it.
var e2bKeyRe = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

// TestKeyShape: new tenant and admin keys have E2B's shape and
// authenticate; an admin.key of the old "bk_" shape keeps working and is not
// replaced on restart.
func TestKeyShape(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := signalsDaemon(t, st, &testClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	ctx := t.Context()

	key, err := d.CreateKey(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	if !e2bKeyRe.MatchString(key) {
		t.Errorf("tenant key %q does not match %s", key, e2bKeyRe)
	}
	if p, err := d.Authenticate(ctx, key); err != nil || p.Owner != "alice" {
		t.Errorf("Authenticate(new key) = %+v, %v", p, err)
	}
	admin, err := d.EnsureAdminKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !e2bKeyRe.MatchString(admin) {
		t.Errorf("admin key %q does not match %s", admin, e2bKeyRe)
	}

	// An install from before: admin.key holds a bk_ key whose hash is stored.
	old := "bk_0123456789abcdef0123456789abcdef0123456789abcdef"
	if err := st.CreateAPIKey(ctx, store.APIKey{ID: "old1", Owner: "admin", Hash: hashKey(old), Admin: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.cfg.DataDir, "admin.key"), []byte(old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := d.EnsureAdminKey(ctx)
	if err != nil || got != old {
		t.Errorf("EnsureAdminKey with an old key = %q, %v; want the old key kept", got, err)
	}
	if p, err := d.Authenticate(ctx, old); err != nil || !p.Admin {
		t.Errorf("Authenticate(old key) = %+v, %v", p, err)
	}
}

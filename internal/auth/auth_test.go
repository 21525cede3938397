package auth

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// e2bKeyRe is the check current E2B SDKs apply to a key before sending it.
var e2bKeyRe = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testService(t *testing.T) (*Service, store.Store, string) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dir := t.TempDir()
	now := func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }
	return New(st, dir, now, []byte("0123456789abcdef0123456789abcdef")), st, dir
}

// TestKeyShape: new tenant and admin keys have E2B's shape and
// authenticate; an admin.key of the old "bk_" shape keeps working and is not
// replaced on restart.
func TestKeyShape(t *testing.T) {
	a, st, dir := testService(t)
	ctx := t.Context()

	key, err := a.CreateKey(ctx, "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	if !e2bKeyRe.MatchString(key) {
		t.Errorf("tenant key %q does not match %s", key, e2bKeyRe)
	}
	if p, err := a.Authenticate(ctx, key); err != nil || p.Owner != "alice" {
		t.Errorf("Authenticate(new key) = %+v, %v", p, err)
	}
	admin, err := a.EnsureAdminKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !e2bKeyRe.MatchString(admin) {
		t.Errorf("admin key %q does not match %s", admin, e2bKeyRe)
	}
	if fi, err := os.Stat(filepath.Join(dir, "admin.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin.key: %v, %v; want mode 0600", fi, err)
	}

	// An install from before: admin.key holds a bk_ key whose hash is stored.
	old := "bk_0123456789abcdef0123456789abcdef0123456789abcdef"
	if err := st.CreateAPIKey(ctx, store.APIKey{ID: "old1", Owner: "admin", Hash: hashKey(old), Admin: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.key"), []byte(old+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := a.EnsureAdminKey(ctx)
	if err != nil || got != old {
		t.Errorf("EnsureAdminKey with an old key = %q, %v; want the old key kept", got, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "admin.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin.key left readable: %v, %v", fi, err)
	}
	if p, err := a.Authenticate(ctx, old); err != nil || !p.Admin {
		t.Errorf("Authenticate(old key) = %+v, %v", p, err)
	}
}

func TestAuthenticateRefuses(t *testing.T) {
	a, _, _ := testService(t)
	for _, key := range []string{"", "e2b_00", "bk_nope"} {
		if _, err := a.Authenticate(t.Context(), key); !errs.Is(err, errs.Unauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want Unauthenticated", key, err)
		}
	}
}

func TestCreateKeyOwners(t *testing.T) {
	a, _, _ := testService(t)
	for _, tc := range []struct {
		owner string
		admin bool
		ok    bool
	}{
		{"alice", false, true},
		{"a.b_c-d", false, true},
		{"Alice", false, false},
		{"", false, false},
		{"-x", false, false},
		{"berth", false, false},
		{"berth-anything", false, false},
		{BuildOwner, false, false},
		{"root", false, false},
		{"admin", false, false},
		{"admin", true, true},
	} {
		_, err := a.CreateKey(t.Context(), tc.owner, tc.admin)
		if (err == nil) != tc.ok {
			t.Errorf("CreateKey(%q, admin=%v) = %v, want ok=%v", tc.owner, tc.admin, err, tc.ok)
		}
		if err != nil && !errs.Is(err, errs.InvalidArgument) {
			t.Errorf("CreateKey(%q) error kind: %v, want InvalidArgument", tc.owner, err)
		}
	}
}

// TestEnvdToken: the token is derived from id and owner (a claim changes
// it), only its hash is stored, and a legacy random hash is replaced once.
func TestEnvdToken(t *testing.T) {
	a, st, _ := testService(t)
	ctx := t.Context()
	sb := &sandbox.Sandbox{ID: "sb1", Owner: "alice", Template: "default", State: sandbox.Running,
		CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), AccessTokenHash: "legacy"}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	tok, err := a.EnvdToken(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if sb.AccessTokenHash != TokenHash(tok) || sb.AccessTokenHash != a.EnvdTokenHash("sb1", "alice") {
		t.Errorf("stored hash %q is not the token's hash", sb.AccessTokenHash)
	}
	if tok2, _ := a.EnvdToken(ctx, sb); tok2 != tok {
		t.Errorf("token not stable: %q then %q", tok, tok2)
	}
	if a.EnvdTokenHash("sb1", "bob") == sb.AccessTokenHash || a.EnvdTokenHash("sb2", "alice") == sb.AccessTokenHash {
		t.Error("token does not depend on id and owner")
	}
	other := New(st, t.TempDir(), nil, []byte("another key of thirty-two bytes!"))
	if other.EnvdTokenHash("sb1", "alice") == sb.AccessTokenHash {
		t.Error("token does not depend on the key")
	}
	got, err := a.SandboxByToken(ctx, tok)
	if err != nil || got.ID != "sb1" {
		t.Errorf("SandboxByToken = %v, %v", got, err)
	}
	if _, err := a.SandboxByToken(ctx, ""); !errs.Is(err, errs.NotFound) {
		t.Errorf("SandboxByToken(\"\") = %v, want NotFound", err)
	}
	if _, err := a.SandboxByToken(ctx, tok+"x"); !errs.Is(err, errs.NotFound) {
		t.Errorf("SandboxByToken(wrong) = %v, want NotFound", err)
	}
	// A changed owner between read and write is a conflict, not a silent rewrite.
	stale := *sb
	stale.AccessTokenHash = "legacy"
	stale.Owner = "mallory"
	if _, err := a.EnvdToken(ctx, &stale); !errs.Is(err, errs.Conflict) {
		t.Errorf("EnvdToken(stale owner) = %v, want Conflict", err)
	}
}

package store

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild(os.Getenv(crashChildEnv))
		return
	}
	goleak.VerifyTestMain(m)
}

func openTemp(t *testing.T) *SQLite {
	t.Helper()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatalf("OpenSQLite: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// OpenTemp is openTemp for suite_test.go (package store_test): exported
// by a test file, so it exists only in the test binary.
var OpenTemp = openTemp

func TestSQLitePragmas(t *testing.T) {
	s := openTemp(t)
	for _, tc := range []struct {
		db     *sql.DB
		pragma string
		want   string
	}{
		{s.w, "journal_mode", "wal"},
		{s.w, "synchronous", "2"}, // FULL
		{s.w, "foreign_keys", "1"},
		{s.w, "busy_timeout", "10000"},
		{s.w, "user_version", fmt.Sprint(len(migrations))},
		{s.r, "journal_mode", "wal"},
		{s.r, "synchronous", "2"},
		{s.r, "query_only", "1"},
	} {
		t.Run(tc.pragma, func(t *testing.T) {
			var got string
			if err := tc.db.QueryRow("PRAGMA " + tc.pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("PRAGMA %s = %q, want %q", tc.pragma, got, tc.want)
			}
		})
	}
}

func TestOpenSQLiteBadPath(t *testing.T) {
	for _, p := range []string{"", "/tmp/a?b", filepath.Join(t.TempDir(), "no", "such", "dir", "berth.db")} {
		t.Run(p, func(t *testing.T) {
			s, err := OpenSQLite(p)
			if err == nil {
				s.Close()
				t.Fatal("OpenSQLite succeeded, want an error")
			}
		})
	}
}

func TestMigrate(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	version := func() int {
		var v int
		if err := s.w.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("idempotent", func(t *testing.T) {
		if err := migrate(ctx, s.w, migrations); err != nil {
			t.Fatal(err)
		}
		if got := version(); got != len(migrations) {
			t.Errorf("user_version = %d, want %d", got, len(migrations))
		}
	})
	t.Run("appended migration applies", func(t *testing.T) {
		next := append(migrations[:len(migrations):len(migrations)],
			`CREATE TABLE snapshots_test (id TEXT PRIMARY KEY) STRICT`)
		if err := migrate(ctx, s.w, next); err != nil {
			t.Fatal(err)
		}
		if got := version(); got != len(next) {
			t.Errorf("user_version = %d, want %d", got, len(next))
		}
		if _, err := s.w.Exec(`INSERT INTO snapshots_test VALUES ('x')`); err != nil {
			t.Errorf("new table unusable: %v", err)
		}
	})
	t.Run("failing migration leaves version unchanged", func(t *testing.T) {
		before := version()
		bad := append(migrations[:len(migrations):len(migrations)], `CREATE TABLE snapshots_test (id TEXT)`, `SELEC nonsense`)
		if err := migrate(ctx, s.w, bad); err == nil {
			t.Fatal("migrate succeeded, want an error")
		}
		if got := version(); got != before {
			t.Errorf("user_version = %d, want %d", got, before)
		}
	})
	t.Run("newer database refused", func(t *testing.T) {
		s.Close()
		if _, err := OpenSQLite(path); !errs.Is(err, errs.FailedPrecondition) {
			t.Errorf("OpenSQLite of a newer schema: err = %v, want FailedPrecondition", err)
		}
	})
}

// TestSQLiteReopen writes every kind of entity, closes the store, opens the
// file again and finds everything.
func TestSQLiteReopen(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := suiteSandbox("sb1", "alice", suiteEpoch)
	sb.Env, sb.IdlePolicy, sb.AccessTokenHash = map[string]string{"A": "b"}, "never", "secret"
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	running, err := s.Transition(ctx, "sb1", sandbox.Running, sandbox.Event{Time: suiteEpoch, Actor: "t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s.ListEvents(ctx, EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	key := APIKey{ID: "k", Owner: "alice", Hash: []byte("hash"), Admin: true, CreatedAt: suiteEpoch}
	if err := s.CreateAPIKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	tmpl, err := s.PutTemplate(ctx, Template{Name: "t", Layers: []string{"l1"}, State: TemplateReady, CreatedAt: suiteEpoch, UpdatedAt: suiteEpoch})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutSetting(ctx, "admin_owner", "root"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	gotSB, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	gotEvs, err := s.ListEvents(ctx, EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	gotKey, err := s.LookupAPIKey(ctx, []byte("hash"))
	if err != nil {
		t.Fatal(err)
	}
	gotTmpl, err := s.GetTemplate(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	gotSetting, err := s.GetSetting(ctx, "admin_owner")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		want, got any
	}{
		{"sandbox", running, gotSB},
		{"events", evs, gotEvs},
		{"api key", key, gotKey},
		{"template", tmpl, gotTmpl},
		{"setting", "root", gotSetting},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s after reopen (-want +got):\n%s", c.name, diff)
		}
	}
}

const crashChildEnv = "BERTH_STORE_CRASH_CHILD"

// crashChild creates sandboxes forever, printing each id after its commit
// returns; the parent SIGKILLs it.
func crashChild(path string) {
	s, err := OpenSQLite(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for i := 0; ; i++ {
		id := fmt.Sprintf("sb%d", i)
		if err := s.CreateSandbox(context.Background(), suiteSandbox(id, "alice", suiteEpoch)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println(id)
	}
}

// TestSQLiteSurvivesSIGKILL kills a writing process and checks that every
// write it reported committed is in the file.
func TestSQLiteSurvivesSIGKILL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var committed []string
	sc := bufio.NewScanner(out)
	for len(committed) < 50 && sc.Scan() {
		committed = append(committed, strings.TrimSpace(sc.Text()))
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() { // ids committed between our last read and the kill
		committed = append(committed, strings.TrimSpace(sc.Text()))
	}
	_ = cmd.Wait()
	if len(committed) < 50 {
		t.Fatalf("child reported only %d commits before exiting", len(committed))
	}

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatalf("open after SIGKILL: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var missing []string
	for _, id := range committed {
		if _, err := s.GetSandbox(ctx, id); err != nil {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d committed sandboxes missing after SIGKILL: %v", len(missing), len(committed), missing)
	}
}

// TestMigrationHashesAccessTokens makes a database as the previous schema
// (version 5) had it, with a plain envd token, through the store's own
// write path, and opens it with this version: the row then holds the
// token's SHA-256 and is found by it, and the plain token finds nothing.
func TestMigrationHashesAccessTokens(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	old, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	old.SetMaxOpenConns(1)
	if err := migrate(ctx, old, migrations[:5]); err != nil {
		t.Fatal(err)
	}
	const plain = "0123456789abcdef0123456789abcdef0123456789abcdef"
	// Rows as version 5 wrote them (its columns; the write path of today
	// writes columns that schema does not have yet).
	for _, r := range [][3]string{{"sb1", "alice", plain}, {"sb2", "bob", ""}} {
		if _, err := old.ExecContext(ctx, `INSERT INTO sandboxes (id, owner, template, template_id, runtime, state,
			reason, message, cpu_millis, memory_mib, disk_mib, pids, created_at, started_at, expires_at, expiry_action,
			access_token, pause_requested, pause_actual, resumed_from, restore_count, auto_resume, version)
			VALUES (?, ?, 'python', 'sha256:ff', 'runc', 'running', '', '', 1000, 512, 1024, 64, 1, 0, 2, 'delete', ?, '', '', '', 0, 0, 1)`,
			r[0], r[1], r[2]); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // what older versions made
		t.Fatal(err)
	}

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum := sha256.Sum256([]byte(plain))
	want := hex.EncodeToString(sum[:])
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got.AccessTokenHash != want {
		t.Fatalf("stored token after migration = %q, want its SHA-256 %q", got.AccessTokenHash, want)
	}
	if byHash, err := s.SandboxByTokenHash(ctx, want); err != nil || byHash.ID != "sb1" {
		t.Fatalf("SandboxByTokenHash(hash) = %v, %v", byHash, err)
	}
	if _, err := s.SandboxByTokenHash(ctx, plain); !errs.Is(err, errs.NotFound) {
		t.Fatalf("the plain token still matches a row: %v", err)
	}
	if got, _ := s.GetSandbox(ctx, "sb2"); got == nil || got.AccessTokenHash != "" {
		t.Fatalf("an empty token was changed: %+v", got)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}

// suiteEpoch and suiteSandbox are storetest's fixtures, repeated here: this
// internal test cannot import storetest, which imports store.
var suiteEpoch = time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.UTC)

func suiteSandbox(id, owner string, created time.Time) *sandbox.Sandbox {
	return &sandbox.Sandbox{
		ID: id, Owner: owner, Template: "default", TemplateID: "sha256:aa", Runtime: "runc",
		State: sandbox.Creating, Labels: map[string]string{"app": "x"},
		Resources: sandbox.Resources{CPUMillis: 500, MemoryMiB: 256, DiskMiB: 1024, Pids: 64},
		CreatedAt: created, ExpiresAt: created.Add(time.Hour), ExpiryAction: sandbox.ExpireStop,
	}
}

package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestMigrateFromV6 opens a database written by the store of schema 6
// (testdata/v6.db, see testdata/genv6) with this binary: every migration
// since applies to real old rows, the typed attrs come out of the old
// Extra map, the tables added since answer for an old sandbox, and
// deleting one still works through every trigger added since.
func TestMigrateFromV6(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "v6.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "berth.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatalf("open a schema-6 database: %v", err)
	}
	defer s.Close()
	var v int
	if err := s.w.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != len(migrations) {
		t.Fatalf("user_version = %d (%v), want %d", v, err, len(migrations))
	}
	ctx := context.Background()
	sb, err := s.GetSandbox(ctx, "fork1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Attrs.Lineage.Parent != "parent1" || sb.Attrs.Lineage.Generation != 2 || len(sb.Attrs.Layers) != 2 {
		t.Fatalf("fork1 attrs after migrating: %+v", sb.Attrs)
	}
	if ts, err := s.ListTasks(ctx, "fork1"); err != nil || len(ts) != 0 {
		t.Fatalf("tasks of an old sandbox: %v, %v", ts, err)
	}
	if ns, err := s.ListNotes(ctx, "fork1", 10); err != nil || len(ns) != 0 {
		t.Fatalf("notes of an old sandbox: %v, %v", ns, err)
	}
	if ls, err := s.ListLeases(ctx, LeaseFilter{SandboxID: "fork1"}); err != nil || len(ls) != 0 {
		t.Fatalf("leases of an old sandbox: %v, %v", ls, err)
	}
	for _, id := range []string{"plain1", "fork1", "legacy1"} {
		if err := s.DeleteSandbox(ctx, id); err != nil {
			t.Fatalf("delete %s after migrating: %v", id, err)
		}
	}
	list, _, err := s.ListSandboxes(ctx, SandboxFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("sandboxes left: %d (%v), want member1 and claimed1", len(list), err)
	}
}

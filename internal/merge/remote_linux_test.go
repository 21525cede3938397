package merge

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRemoteApplyMatchesApply: staging through a tar (WriteStage →
// StageFromTar) and Commit give the tree Apply gives, and a Recover of a
// committed journal only removes the staging dir.
func TestRemoteApplyMatchesApply(t *testing.T) {
	ctx := context.Background()
	local := newApplyFixture(t)
	p, err := Compute(ctx, local.in, Options{})
	if err != nil || !p.Clean() {
		t.Fatalf("plan: %v %v", err, p)
	}
	if err := Apply(ctx, local.target, p, local.src, "m1", ApplyOptions{Save: func(*Journal) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	want := snapshotDir(t, local.target)

	remote := newApplyFixture(t)
	p, err = Compute(ctx, remote.in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	j := NewJournal(p, "m2")
	var buf bytes.Buffer
	if err := WriteStage(ctx, &buf, j, p, remote.src); err != nil {
		t.Fatal(err)
	}
	// A bad tar is refused before anything is committed.
	if err := StageFromTar(ctx, remote.target, j, bytes.NewReader([]byte("not a tar at all, just bytes of junk padding...")), StageOptions{}); err == nil {
		t.Error("StageFromTar took junk")
	}
	if err := StageFromTar(ctx, remote.target, j, bytes.NewReader(buf.Bytes()), StageOptions{}); err != nil {
		t.Fatal(err)
	}
	j.State = JournalCommitting
	steps := 0
	if rolledBack, err := Commit(remote.target, j, func(int) { steps++ }); err != nil || rolledBack {
		t.Fatalf("Commit: rolled back %v, %v", rolledBack, err)
	}
	if steps != len(j.Steps) {
		t.Errorf("afterStep ran %d times for %d steps", steps, len(j.Steps))
	}
	j.State = JournalCommitted
	if err := Recover(remote.target, j); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(remote.target, j.Staging)); !os.IsNotExist(err) {
		t.Errorf("staging dir left: %v", err)
	}
	if d := cmp.Diff(want, snapshotDir(t, remote.target)); d != "" {
		t.Errorf("remote apply differs from Apply (-apply +remote):\n%s", d)
	}
}

// TestRemoteCommitInterrupted: a commit stopped midway is rolled back by
// Recover to the tree before the merge.
func TestRemoteCommitInterrupted(t *testing.T) {
	ctx := context.Background()
	f := newApplyFixture(t)
	before := snapshotDir(t, f.target)
	p, _ := Compute(ctx, f.in, Options{})
	j := NewJournal(p, "m3")
	var buf bytes.Buffer
	if err := WriteStage(ctx, &buf, j, p, f.src); err != nil {
		t.Fatal(err)
	}
	if err := StageFromTar(ctx, f.target, j, &buf, StageOptions{}); err != nil {
		t.Fatal(err)
	}
	j.State = JournalCommitting
	// Run only the first half of the steps, as a killed daemon would leave them.
	half := &Journal{ID: j.ID, State: j.State, Staging: j.Staging, Steps: j.Steps[:len(j.Steps)/2]}
	if _, err := Commit(f.target, half, nil); err != nil {
		t.Fatal(err)
	}
	if err := Recover(f.target, j); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, snapshotDir(t, f.target)); d != "" {
		t.Errorf("after recovery (-before +after):\n%s", d)
	}
}

package fsdiff_test

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/fsdiff/fsdifftest"
)

// BenchmarkDiff100Files is the figure: a fork that changed 100
// files of a 1 GiB workspace, diffed with unified text (goal ≤ 100 ms).
func BenchmarkDiff100Files(b *testing.B) {
	w := fsdifftest.NewWorkspace(b, 100)
	lower, err := fsdiff.OpenDirLayer(w.Lower, "lower", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer lower.Close()
	upper, err := fsdiff.OpenDirLayer(w.Uppers[0], "upper", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer upper.Close()
	b.ResetTimer()
	for b.Loop() {
		r, err := fsdiff.Diff(context.Background(), fsdiff.NewTree(lower), fsdiff.NewTree(upper, lower), fsdiff.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if r.Stat.Modified != 100 || r.Stat.LinesAdded != 100 {
			b.Fatalf("stat %+v, want 100 files with one line each", r.Stat)
		}
	}
}

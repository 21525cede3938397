package merge

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/fsdiff/fsdifftest"
)

// BenchmarkMerge100Files merges a child that changed 100 files of a 1 GiB
// workspace into a parent that changed other lines of the same files: 100
// clean line merges (goal ≤ 500 ms).
func BenchmarkMerge100Files(b *testing.B) {
	w := fsdifftest.NewWorkspace(b, 10, 150)
	open := func(dir, id string) *fsdiff.DirLayer {
		l, err := fsdiff.OpenDirLayer(dir, id, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		return l
	}
	lower, ours, theirs := open(w.Lower, "lower"), open(w.Uppers[0], "ours"), open(w.Uppers[1], "theirs")
	in := Inputs{Base: fsdiff.NewTree(lower), Ours: fsdiff.NewTree(ours, lower), Theirs: fsdiff.NewTree(theirs, lower)}
	b.ResetTimer()
	for b.Loop() {
		// Trees cache lookups; a fresh set per merge measures cold work.
		in := Inputs{Base: fsdiff.NewTree(in.Base.Layers()...), Ours: fsdiff.NewTree(in.Ours.Layers()...), Theirs: fsdiff.NewTree(in.Theirs.Layers()...)}
		p, err := Compute(context.Background(), in, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if !p.Clean() || len(p.Writes) != 100 {
			b.Fatalf("%d writes, %d conflicts; want 100 clean writes", len(p.Writes), len(p.Conflicts))
		}
	}
}

// BenchmarkMergeApply100Files is the whole merge: plan, stage, verify and
// commit the 100 merged files into a target tree (the parent's view),
// journal saves included (to memory here; the daemon fsyncs a file).
func BenchmarkMergeApply100Files(b *testing.B) {
	w := fsdifftest.NewWorkspace(b, 10, 150)
	lower, err := fsdiff.OpenDirLayer(w.Lower, "lower", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer lower.Close()
	theirs, err := fsdiff.OpenDirLayer(w.Uppers[1], "theirs", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer theirs.Close()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		target := filepath.Join(b.TempDir(), "target")
		if err := os.CopyFS(target, os.DirFS(w.Uppers[0])); err != nil {
			b.Fatal(err)
		}
		ours, err := fsdiff.OpenDirLayer(target, "ours", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		in := Inputs{Base: fsdiff.NewTree(lower), Ours: fsdiff.NewTree(ours, lower), Theirs: fsdiff.NewTree(theirs, lower)}
		p, err := Compute(context.Background(), in, Options{})
		if err != nil || !p.Clean() {
			b.Fatal(err, p.Conflicts)
		}
		err = Apply(context.Background(), target, p, Sources{SideTheirs: in.Theirs}, fmt.Sprint("b", i), ApplyOptions{
			Save:         func(j *Journal) error { _, err := json.Marshal(j); return err },
			BeforeCommit: func() error { return Verify(p, fsdiff.NewTree(ours, lower)) },
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		ours.Close()
		b.StartTimer()
	}
}

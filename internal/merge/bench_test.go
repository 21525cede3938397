package merge

import (
	"context"
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

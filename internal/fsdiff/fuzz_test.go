package fsdiff

import (
	"bytes"
	"context"
	"testing"
)

// FuzzTarLayer feeds a sandbox-controlled upper tar (runsc's export) to
// the index and a diff against the base: it may be refused, never panic,
// and every change it yields is a path of the tar or below one.
func FuzzTarLayer(f *testing.F) {
	f.Add(tarBytes(f, dir("src"), file("src/a", "a\n"), whiteout("data"), symlink("l", "/etc")))
	f.Add(tarBytes(f, opaqueDir("data"), file("data/z", "\x00"), device("dev")))
	f.Add(tarBytes(f, file("a/b/c", "deep")))
	lower := base(f) // read-only, shared by every run
	f.Fuzz(func(t *testing.T, data []byte) {
		upper, err := NewTarLayer("upper", bytes.NewReader(data), TarOptions{MaxEntries: 1000, MaxInline: 4096, MaxTotal: 1 << 16})
		if err != nil {
			return
		}
		r, err := Diff(context.Background(), NewTree(lower), NewTree(upper, lower), Options{MaxEntries: 5000, MaxTextBytes: 4096})
		if err != nil {
			return
		}
		for _, c := range r.Changes {
			if c.Path == "" || c.Path[0] == '/' || c.Kind == "" {
				t.Fatalf("bad change %+v", c)
			}
		}
	})
}

package template

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkImport measures importing the built-in template tars into a
// fresh store (extraction only; the tars come from the host cache).
//
//	go test -run '^$' -bench Import -benchtime 3x ./internal/template
func BenchmarkImport(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ctx := context.Background()
	for _, name := range []string{TinyName, DefaultName} {
		b.Run(name, func(b *testing.B) {
			var tarPath string
			var err error
			if name == TinyName {
				tarPath, err = BuildTiny(ctx, b.TempDir(), nil)
			} else {
				tarPath = filepath.Join(cacheDir(), DefaultTarName())
				if !fileExists(tarPath) {
					b.Skip("default tar not built; run scripts/setup.sh --no-serve")
				}
			}
			if err != nil {
				b.Fatal(err)
			}
			fi, _ := os.Stat(tarPath)
			b.SetBytes(fi.Size())
			for b.Loop() {
				b.StopTimer()
				s, err := Open(b.TempDir(), nil)
				if err != nil {
					b.Fatal(err)
				}
				f, err := os.Open(tarPath)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := s.ImportTar(ctx, f, nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				f.Close()
				b.StartTimer()
			}
		})
	}
}

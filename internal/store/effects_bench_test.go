package store

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The floor under the side-effect ledger's cost (docs/EFFECTS.md): what
// one durable write costs on this machine's disk, without the proxy.
//
//   - commit: one effect intent inserted and committed (RecordEffect:
//     one small INSERT, one transaction, WAL, synchronous=FULL: the
//     store's rule) — what every recorded request must wait for once.
//   - commit/batch8: WriteEffects with 8 intents in one transaction; ns/op
//     is per intent.
//   - fsync: 64 bytes appended to a file and fsync'd (os.File.Sync), the
//     disk's own floor under any durable commit.
func BenchmarkDurableWrite(b *testing.B) {
	dir := b.TempDir()
	s, err := OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	mk := func(i int) *Effect {
		return &Effect{ID: "ef" + strconv.Itoa(i) + "x" + strconv.FormatInt(time.Now().UnixNano(), 36), Lineage: "bs", SandboxID: "bs",
			Owner: "o", Method: "POST", Host: "example.com", Path: "/v1/charges", BodySHA256: "ab", Key: "k" + strconv.Itoa(i), Identity: "i"}
	}
	b.Run("commit", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := s.RecordEffect(b.Context(), *mk(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("commit/batch8", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			ws := make([]EffectWrite, 8)
			for k := range ws {
				ws[k].Record = mk(i*8 + k)
			}
			if res, err := s.WriteEffects(b.Context(), ws); err != nil || res[7] != nil {
				b.Fatal(err, res)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*8), "ns/intent")
	})
	// after20ms: the same commit after the store and the disk sat idle
	// for 20 ms (an upstream's time to answer), the sleep outside the
	// timing: is a commit after an idle gap slower than back to back?
	b.Run("commit/after20ms", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			time.Sleep(20 * time.Millisecond)
			b.StartTimer()
			if _, err := s.RecordEffect(b.Context(), *mk(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fsync", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 64)
		for b.Loop() {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fsync/after20ms", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(dir, "g"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 64)
		for b.Loop() {
			b.StopTimer()
			time.Sleep(20 * time.Millisecond)
			b.StartTimer()
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

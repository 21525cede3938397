package audit

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/store"
)

// benchEnv is a running chain on a real SQLite file with its head file.
func benchEnv(b *testing.B) (*Service, func()) {
	dir := b.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	svc := New(Config{Key: testKey, HeadPath: filepath.Join(dir, HeadFile)}, owners{"sb1": "alice"}, st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	return svc, func() { cancel(); <-done; st.Close() }
}

func apiEntry() Entry {
	return Entry{Actor: "alice", Action: "api", SandboxID: "sb1", Owner: "alice",
		Data: map[string]string{"method": "POST", "route": "POST /v1/sandboxes/{id}/exec", "status": "200"}}
}

// BenchmarkRecord is what an API call pays: one Record (the writer runs
// alongside, as in the daemon). The queue is drained, off the clock, every
// 1024 entries, so no entry takes the (cheaper) dropped path.
func BenchmarkRecord(b *testing.B) {
	svc, stop := benchEnv(b)
	defer stop()
	e := apiEntry()
	n := 0
	for b.Loop() {
		svc.Record(e)
		if n++; n%1024 == 0 {
			b.StopTimer()
			_ = svc.Flush(context.Background())
			b.StartTimer()
		}
	}
	svc.mu.Lock()
	dropped := svc.dropped
	svc.mu.Unlock()
	if dropped != 0 {
		b.Fatalf("%d entries dropped", dropped)
	}
	b.StopTimer()
	if err := svc.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWrite is the writer's throughput: entries hashed, MACed and
// committed per second (batches of up to 512, a head file fsync each).
func BenchmarkWrite(b *testing.B) {
	svc, stop := benchEnv(b)
	defer stop()
	e := apiEntry()
	n := 0
	for b.Loop() {
		svc.Record(e)
		n++
		if n%4096 == 0 {
			_ = svc.Flush(context.Background())
		}
	}
	if err := svc.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkVerify walks a chain of 10000 entries.
func BenchmarkVerify(b *testing.B) {
	svc, stop := benchEnv(b)
	defer stop()
	e := apiEntry()
	for i := range 10000 {
		svc.Record(e)
		if i%4096 == 0 {
			_ = svc.Flush(context.Background())
		}
	}
	_ = svc.Flush(context.Background())
	for b.Loop() {
		r, err := svc.Verify(context.Background())
		if err != nil || !r.OK() || r.Entries < 10000 {
			b.Fatalf("verify = %+v, %v", r, err)
		}
	}
}

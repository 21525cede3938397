package effects

import (
	"context"
	"strconv"
	"testing"

	"github.com/berth-dev/berth/internal/egress"
)

// BenchmarkBeginFinish is the ledger alone, without the proxy: one
// recorded effect's Begin (its intent durable) and Finish (its outcome
// handed to the committer), one after another, as the proxy calls them
// for requests on one kept-alive connection.
func BenchmarkBeginFinish(b *testing.B) {
	l, _ := newLedger(b, Config{MaxPerSandbox: 1 << 30, ReplayBudget: 1 << 40}, "a")
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		tk, err := l.Begin(ctx, post("a", "k"+strconv.Itoa(i), "b"))
		if err != nil || tk.Effect == "" {
			b.Fatal(tk, err)
		}
		l.Finish(ctx, tk.Effect, egress.Outcome{Status: 200, Body: []byte("ok"), Complete: true, Size: 2})
	}
}

package checkpoint

import (
	"context"
	"log/slog"
	"time"
)

// phases times the steps of one pause or resume for the debug log, as the
// boot logs its own: where a freeze's milliseconds go (lock, store reads
// and writes, hooks, the freezer itself).
type phases struct {
	op    string
	start time.Time
	last  time.Time
	attrs []any
}

func newPhases(op string) *phases {
	now := time.Now()
	return &phases{op: op, start: now, last: now}
}

// mark ends the step called name.
func (p *phases) mark(name string) {
	now := time.Now()
	p.attrs = append(p.attrs, name+"_ms", msOf(now.Sub(p.last)))
	p.last = now
}

func (p *phases) log(ctx context.Context, log *slog.Logger, id string, err error) {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := append([]any{"sandbox_id", id}, p.attrs...)
	attrs = append(attrs, "total_ms", msOf(time.Since(p.start)))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	log.DebugContext(ctx, p.op+" phases", attrs...)
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Package phases times the steps of one operation for the daemon's debug
// log: a "<op> phases" line with each step's milliseconds and the total
// (pause, resume, restore, lease changes).
package phases

import (
	"context"
	"log/slog"
	"time"
)

// Timer times the steps of one operation.
type Timer struct {
	op          string
	start, last time.Time
	attrs       []any
}

// Start starts timing operation op.
func Start(op string) *Timer {
	now := time.Now()
	return &Timer{op: op, start: now, last: now}
}

// Mark ends the step called name.
func (p *Timer) Mark(name string) {
	now := time.Now()
	p.attrs = append(p.attrs, name+"_ms", Ms(now.Sub(p.last)))
	p.last = now
}

// Add records a duration measured apart (a step that ran beside another).
func (p *Timer) Add(name string, d time.Duration) { p.attrs = append(p.attrs, name+"_ms", Ms(d)) }

// Log writes the phases line at debug for sandbox id, with err if any.
func (p *Timer) Log(ctx context.Context, log *slog.Logger, id string, err error) {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := append([]any{"sandbox_id", id}, p.attrs...)
	attrs = append(attrs, "total_ms", Ms(time.Since(p.start)))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	log.DebugContext(ctx, p.op+" phases", attrs...)
}

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

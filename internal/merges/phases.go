package merges

import (
	"maps"
	"strconv"
	"time"
)

// Phases are where a merge's time went, in milliseconds (0.1 ms
// resolution) by phase, from the request to the applied reply:
//
//	capture  snapshot of the source (its lock, freeze, copy of its upper)
//	plan     views of base, theirs and ours, merge.Compute
//	store    the merge's rows (and, when applied, its final state)
//	prepare  views of the sources for the apply
//	journal  the journal's durable saves (prepared, committing, committed)
//	stage    staged objects written (runc: beneath the target's rootfs;
//	         runsc: one streamed tar to the agent)
//	freeze   runc: cgroup freeze; runsc: the agent SIGSTOPs the other
//	         processes and lists their open files
//	verify   fresh view of ours, merge.Verify (and, on runc, the open files)
//	commit   the renames (runsc: /merge/commit to the agent)
//	finish   thaw / SIGCONT and removal of the staging dir
//
// A phase that ran more than once (a re-plan) is the sum of its runs.
type Phases map[string]float64

// clock accumulates Phases: mark(name) adds the time since the last mark.
type clock struct {
	last time.Time
	p    Phases
}

func newClock(start time.Time) *clock { return &clock{last: start, p: Phases{}} }

func (c *clock) mark(name string) {
	if c == nil {
		return
	}
	now := time.Now()
	ms := float64(now.Sub(c.last).Microseconds()) / 1000
	c.p[name] = float64(int64((c.p[name]+ms)*10+0.5)) / 10
	c.last = now
}

// phases is a copy of what was measured.
func (c *clock) phases() Phases {
	if c == nil {
		return nil
	}
	return maps.Clone(c.p)
}

// eventData adds the phases to an event's data as <phase>_ms.
func (p Phases) eventData(data map[string]string) map[string]string {
	for k, v := range p {
		data[k+"_ms"] = strconv.FormatFloat(v, 'f', 1, 64)
	}
	return data
}

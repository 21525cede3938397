package egress_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/store"
)

// phaseClock collects the instants of one request's phases, one request
// at a time (the phase benchmark runs a single client).
type phaseClock struct {
	mu                   sync.Mutex
	beginAt, beganAt     time.Time
	upAt, upDone         time.Time
	decide, commit, idle time.Duration
	lastCommitEnd        time.Time
}

func (p *phaseClock) note(f func(p *phaseClock)) {
	p.mu.Lock()
	f(p)
	p.mu.Unlock()
}

// timedStore times the two store calls on a recorded request's path: the
// decision's read and the commit that carries the intent.
type timedStore struct {
	store.Store
	pc *phaseClock
}

func (s timedStore) FindEffects(ctx context.Context, lineage, key, identity string, limit int) ([]store.Effect, error) {
	t := time.Now()
	defer func() { d := time.Since(t); s.pc.note(func(p *phaseClock) { p.decide += d }) }()
	return s.Store.FindEffects(ctx, lineage, key, identity, limit)
}

func (s timedStore) WriteEffects(ctx context.Context, ws []store.EffectWrite) ([]error, error) {
	t := time.Now()
	defer func() {
		end := time.Now()
		s.pc.note(func(p *phaseClock) {
			for _, w := range ws {
				if w.Record != nil { // the intent's commit: the one the request waits for
					p.commit += end.Sub(t)
					if !p.lastCommitEnd.IsZero() {
						p.idle = t.Sub(p.lastCommitEnd)
					}
				}
			}
			p.lastCommitEnd = end
		})
	}()
	return s.Store.WriteEffects(ctx, ws)
}

type timedLedger struct {
	egress.Ledger
	pc *phaseClock
}

func (l timedLedger) Begin(ctx context.Context, in egress.Intent) (egress.Ticket, error) {
	l.pc.note(func(p *phaseClock) { p.beginAt = time.Now() })
	defer l.pc.note(func(p *phaseClock) { p.beganAt = time.Now() })
	return l.Ledger.Begin(ctx, in)
}

// BenchmarkHTTPSPhases splits one kept-alive recorded HTTPS request (the
// upstream answering at once, or after 20 ms) into its phases, as means
// in ms: pre (the client's write to the ledger's Begin: TLS in, parse,
// inject), decide (the decision's indexed read), commit (the commit that
// carries the intent), begin-rest (the rest of Begin), send (Begin's
// return to the upstream's handler: write + TLS out), up (the handler),
// relay (the handler's answer to the client's last byte); gap-ms is the
// idle time of the store before the intent's commit.
func BenchmarkHTTPSPhases(b *testing.B) {
	for _, delay := range []time.Duration{0, 20 * time.Millisecond} {
		name := "keepalive"
		if delay > 0 {
			name = "keepalive/up20ms"
		}
		b.Run(name, func(b *testing.B) { benchPhases(b, delay) })
	}
}

func benchPhases(b *testing.B, delay time.Duration) {
	pc := &phaseClock{}
	h := newHTTPSPathWith(b, pathOptions{ledger: true,
		wrapStore:  func(st store.Store) store.Store { return timedStore{st, pc} },
		wrapLedger: func(l egress.Ledger) egress.Ledger { return timedLedger{l, pc} },
		handler: upstreamHandler(delay, func(start bool) {
			pc.note(func(p *phaseClock) {
				if start {
					p.upAt = time.Now()
				} else {
					p.upDone = time.Now()
				}
			})
		})})
	c := h.conn(b)
	br := bufio.NewReader(c)
	var sum [7]time.Duration
	var gap time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		pc.note(func(p *phaseClock) { p.decide, p.commit = 0, 0 })
		t0 := time.Now()
		roundTrip(b, c, br, i)
		t1 := time.Now()
		pc.note(func(p *phaseClock) {
			sum[0] += p.beginAt.Sub(t0)
			sum[1] += p.decide
			sum[2] += p.commit
			sum[3] += p.beganAt.Sub(p.beginAt) - p.decide - p.commit
			sum[4] += p.upAt.Sub(p.beganAt)
			sum[5] += p.upDone.Sub(p.upAt)
			sum[6] += t1.Sub(p.upDone)
			gap += p.idle
		})
		n++
	}
	b.StopTimer()
	for k, name := range []string{"pre", "decide", "commit", "begin-rest", "send", "up", "relay"} {
		b.ReportMetric(float64(sum[k].Microseconds())/float64(n)/1000, name+"-ms")
	}
	b.ReportMetric(float64(gap.Microseconds())/float64(n)/1000, "gap-ms")
	c.Close()
	h.wg.Wait()
}

// upstreamHandler answers like a payment API after delay; mark (may be
// nil) is told when it starts (the request's head has arrived) and ends.
func upstreamHandler(delay time.Duration, mark func(start bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mark != nil {
			mark(true)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if delay > 0 {
			time.Sleep(delay) // a typical API's time to answer
		}
		if mark != nil {
			mark(false)
		}
		_, _ = io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	})
}

package effects

import (
	"context"
	"log/slog"
	"sync"

	"github.com/berth-dev/berth/internal/store"
)

// maxBatch bounds the writes of one commit; the rest go into the next.
const maxBatch = 256

// committer is the ledger's group commit. Every intent and outcome goes
// through it; the writes queued while a commit is under way go into the
// next one together, so N requests arriving at once cost one fsync, not N.
// A request's intent is still durable before that request is sent: Begin
// waits for the commit that carries it. Outcomes are not waited for: the
// answer has been relayed already, and the effect stays in flight in the
// ledger (a repeat waits for it) until the commit that records it is done.
//
// It runs no goroutine while idle: the first write queued starts one,
// which commits until the queue is empty and then ends.
type committer struct {
	st  func() store.Store
	log *slog.Logger

	mu      sync.Mutex
	queue   []job
	busy    bool
	waiters []chan struct{} // Flush callers, released when the queue is empty
}

// job is one write and what to do once its commit is done (err: the
// write's own error, or the commit's). done runs on the committer's
// goroutine, after the commit and outside c.mu.
type job struct {
	w    store.EffectWrite
	done func(err error)
}

func (c *committer) submit(j job) {
	c.mu.Lock()
	c.queue = append(c.queue, j)
	start := !c.busy
	c.busy = true
	c.mu.Unlock()
	if start {
		go c.run()
	}
}

func (c *committer) run() {
	for {
		c.mu.Lock()
		n := min(len(c.queue), maxBatch)
		if n == 0 {
			c.busy = false
			for _, w := range c.waiters {
				close(w)
			}
			c.waiters = nil
			c.mu.Unlock()
			return
		}
		batch := c.queue[:n:n]
		c.queue = append([]job(nil), c.queue[n:]...)
		c.mu.Unlock()
		ws := make([]store.EffectWrite, len(batch))
		for i, j := range batch {
			ws[i] = j.w
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		res, err := c.st().WriteEffects(ctx, ws)
		cancel()
		if err != nil {
			c.log.Error("side-effect ledger: commit failed", "writes", len(ws), "err", err)
		}
		for i, j := range batch {
			e := err
			if e == nil {
				e = res[i]
			}
			j.done(e)
		}
	}
}

// flush waits until every write queued before it is committed (or ctx ends).
func (c *committer) flush(ctx context.Context) error {
	c.mu.Lock()
	if !c.busy {
		c.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

package effects

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/store"
)

// maxBatch bounds the writes of one commit; the rest go into the next.
const maxBatch = 256

// linger is how long an outcome may wait for an intent's commit to share:
// on a busy connection the next request's intent comes within it, and the
// two cost one commit; otherwise the outcome is committed on its own when
// it is up. Until then the effect is in flight (a repeat waits, a crash
// leaves it unknown).
const linger = 5 * time.Millisecond

// committer is the ledger's group commit. Every intent and outcome goes
// through it; the writes queued while a commit is under way go into the
// next one together, so N requests arriving at once cost one fsync, not N.
// A request's intent is still durable before that request is sent: Begin
// waits for the commit that carries it. Outcomes are not waited for: the
// answer has been relayed already, and the effect stays in flight in the
// ledger (a repeat waits for it) until the commit that records it is done.
//
// Outcomes (lazy jobs) linger: they ride along with the next intent's
// commit, or are committed on their own after linger.
//
// It runs no goroutine while idle: the first write due starts one, which
// commits until nothing due is left and then ends.
type committer struct {
	st     func() store.Store
	log    *slog.Logger
	linger time.Duration

	mu      sync.Mutex
	queue   []job
	eager   int  // jobs in queue that are not lazy
	due     bool // the lazy jobs in queue are due (linger is up, or a flush)
	busy    bool // a goroutine is committing
	timer   *time.Timer
	waiters []chan struct{} // Flush callers, released when the queue is empty
	commits int64           // commits made, and the writes they carried
	writes  int64
}

// job is one write and what to do once its commit is done (err: the
// write's own error, or the commit's). done runs on the committer's
// goroutine, after the commit and outside c.mu. A lazy job may wait up to
// linger for company.
type job struct {
	w    store.EffectWrite
	lazy bool
	done func(err error)
}

func (c *committer) submit(j job) {
	c.mu.Lock()
	c.queue = append(c.queue, j)
	if !j.lazy {
		c.eager++
	}
	start := c.startLocked()
	c.mu.Unlock()
	if start {
		go c.run()
	}
}

// startLocked reports whether a goroutine must be started to commit what
// is due (and marks it busy); with only lingering jobs it arms the timer.
func (c *committer) startLocked() bool {
	switch {
	case c.busy || len(c.queue) == 0:
		return false
	case c.eager > 0 || c.due:
		c.busy = true
		return true
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(c.linger, c.expire)
	}
	return false
}

func (c *committer) expire() {
	c.mu.Lock()
	c.timer, c.due = nil, len(c.queue) > 0
	start := c.startLocked()
	c.mu.Unlock()
	if start {
		go c.run()
	}
}

func (c *committer) run() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || c.eager == 0 && !c.due {
			c.busy = false
			if len(c.queue) == 0 {
				for _, w := range c.waiters {
					close(w)
				}
				c.waiters = nil
			} else {
				c.startLocked() // arms the timer for what lingers
			}
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxBatch)
		batch := c.queue[:n:n]
		c.queue = append([]job(nil), c.queue[n:]...)
		c.eager, c.due = 0, len(c.queue) > 0 && c.due
		lazy := false
		for _, j := range c.queue {
			if !j.lazy {
				c.eager++
			} else {
				lazy = true
			}
		}
		if !lazy && c.timer != nil {
			// Nothing lingers any more: a stale timer would commit the
			// next outcome early, alone.
			c.timer.Stop()
			c.timer = nil
		}
		c.mu.Unlock()
		ws := make([]store.EffectWrite, len(batch))
		for i, j := range batch {
			ws[i] = j.w
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		res, err := c.st().WriteEffects(ctx, ws)
		cancel()
		c.mu.Lock()
		c.commits++
		c.writes += int64(len(ws))
		c.mu.Unlock()
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
	if !c.busy && len(c.queue) == 0 {
		c.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	c.waiters = append(c.waiters, w)
	c.due = true
	start := c.startLocked()
	c.mu.Unlock()
	if start {
		go c.run()
	}
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

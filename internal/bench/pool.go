package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// WarmPoolSize is the size of the warm pools the bench sets up; the pool
// is refilled to it (outside the clock) before every sample.
const WarmPoolSize = 3

const (
	poolFillLimit   = 5 * time.Minute // first fill
	poolRefillLimit = 2 * time.Minute // between samples
	poolDrainLimit  = 2 * time.Minute
)

// warmPool is a pool the bench set up on a template, and how to put back
// what was there before.
type warmPool struct {
	r     *Runner
	tpl   string
	prior *wire.PoolStatus // the server's own pool on tpl, restored afterwards
	start wire.PoolStatus  // status once first filled: hits and misses count from here
}

// setWarmPool sets a pool of WarmPoolSize for tpl on runtime rt ("" = the
// server's default) with default resources, and waits until it is full.
// Unless it returns nil, the caller must call restore.
func (r *Runner) setWarmPool(ctx context.Context, tpl, rt string) (*warmPool, error) {
	old, had, err := r.c.Pool(ctx, tpl)
	if err != nil {
		return nil, err
	}
	wp := &warmPool{r: r, tpl: tpl}
	if had {
		wp.prior = &old
	}
	size := WarmPoolSize
	if _, err := r.c.SetPool(ctx, tpl, wire.PoolRequest{Size: &size, Runtime: rt}); err != nil {
		return nil, err
	}
	wp.start, err = wp.waitFull(ctx, poolFillLimit)
	return wp, err
}

// waitFull polls the pool until it has WarmPoolSize ready members and
// none starting (a refill in progress would compete with the sample).
func (wp *warmPool) waitFull(ctx context.Context, limit time.Duration) (wire.PoolStatus, error) {
	deadline := time.Now().Add(limit)
	for {
		st, ok, err := wp.r.c.Pool(ctx, wp.tpl)
		switch {
		case err != nil:
			return st, err
		case !ok:
			return st, fmt.Errorf("the pool of %s disappeared", wp.tpl)
		case st.Ready >= WarmPoolSize && st.Starting == 0:
			return st, nil
		case time.Now().After(deadline):
			return st, fmt.Errorf("the pool of %s did not fill to %d within %s (ready %d, starting %d, state %s %s)",
				wp.tpl, WarmPoolSize, limit, st.Ready, st.Starting, st.State, st.Error)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// counters are the pool's hits and misses since it was first full (and
// its claim latency p50, in µs, as the server reports it).
func (wp *warmPool) counters(ctx context.Context) map[string]float64 {
	st, ok, err := wp.r.c.Pool(ctx, wp.tpl)
	if err != nil || !ok {
		return nil
	}
	return map[string]float64{"pool_hits": float64(st.Hits - wp.start.Hits), "pool_misses": float64(st.Misses - wp.start.Misses),
		"claim_p50_us": float64(st.ClaimP50Micros)}
}

// restore puts the server's own pool back, or removes the bench's and
// waits until its members are drained, so that they neither compete with
// the next metric nor outlive the server.
func (wp *warmPool) restore(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), poolDrainLimit+time.Minute)
	defer cancel()
	if p := wp.prior; p != nil {
		size := p.Size
		_, err := wp.r.c.SetPool(ctx, wp.tpl, wire.PoolRequest{Size: &size, Runtime: p.Runtime,
			CPU: float64(p.Resources.CPUMillis) / 1000, MemoryMiB: p.Resources.MemoryMiB, DiskMiB: p.Resources.DiskMiB,
			Pids: p.Resources.Pids, Auto: p.Auto, Min: p.Min, Max: p.Max})
		if err != nil {
			wp.r.logf("restoring the pool of %s: %v", wp.tpl, err)
		}
		return
	}
	if err := wp.r.c.DeletePool(ctx, wp.tpl); err != nil {
		wp.r.logf("removing the pool of %s: %v", wp.tpl, err)
		return
	}
	deadline := time.Now().Add(poolDrainLimit)
	for {
		page, err := wp.r.c.List(ctx, client.ListOptions{Owner: wire.PoolOwner})
		if err != nil {
			wp.r.logf("waiting for the pool of %s to drain: %v", wp.tpl, err)
			return
		}
		left := 0
		for _, sb := range page.Sandboxes {
			if sb.Extra["pool"] == wp.tpl {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			wp.r.logf("the pool of %s still has %d member(s) %s after its removal", wp.tpl, left, poolDrainLimit)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

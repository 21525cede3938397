package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

const defActivityFollow = "Clock starts when `exec true` has returned (its exit event read from the exec stream) and stops when " +
	"that exec's entry has been read from an already open GET /v1/sandboxes/{id}/activity?follow=true&kind=exec stream " +
	"(the recorder's queue, its batch linger, the SQLite write and the follower's wake-up)."

// activityFollow is the "activity-follow" row: how soon a follower of a
// sandbox's timeline sees an exec that just ended.
func (r *Runner) activityFollow(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "activity-follow", Runtime: rt, Unit: "ms", Definition: defActivityFollow, Available: true}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "create failed: "+err.Error())}
	}
	defer r.remove(ctx, sb.ID)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := r.c.Sandbox(sb.ID).FollowActivity(sctx, client.ActivityOptions{Kinds: []string{wire.ActivityExec}})
	if err != nil {
		if noRoute(err) {
			return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "the server has no activity timeline")}
		}
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "follow failed: "+err.Error())}
	}
	defer st.Close()
	seen := make(chan wire.ActivityEntry, 64)
	go func() {
		defer close(seen)
		for {
			e, err := st.Next()
			if err != nil {
				return
			}
			seen <- e
		}
	}()
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		res, err := r.c.Exec(ctx, sb.ID, "true")
		start := time.Now()
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("true exited %d", res.ExitCode)
		}
		timeout := time.After(10 * time.Second)
		for {
			select {
			case e, ok := <-seen:
				if !ok {
					return 0, fmt.Errorf("the follow stream ended")
				}
				if slices.Equal(e.Data.Argv, []string{"true"}) && e.Data.ExitCode != nil {
					return time.Since(start), nil
				}
			case <-timeout:
				return 0, fmt.Errorf("the exec's entry did not arrive within 10 s")
			}
		}
	})
	return []Metric{m}
}

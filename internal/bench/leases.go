package bench

import (
	"context"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// The credential-lease row (internal/leases, docs/LEASES.md): a freeze
// pause and resume of a sandbox holding a leased secret, against the same
// of a sandbox without one, measured alternately on the same server.

const (
	defPauseLeases   = "A running sandbox granted one secret (one lease); the clock starts when POST /v1/sandboxes/{id}/pause {mode: freeze} is sent and stops when the POST /v1/sandboxes/{id}/resume that follows has answered and an `echo ok` exec has returned its output: the pause freezes the lease, the resume revokes it and issues the next generation (store transaction, env.json and /run/berth/leases.env rewritten, the proxy's grants replaced). Baseline: the same cycle of a sandbox with the same policy (the secret's host allowed) but no secret, alternating with it (which goes first alternates too). Goal ratio ≤ 1.05."
	defPauseNoLeases = "The same pause (freeze) + resume + `echo ok` cycle of a sandbox with the same policy, granted no secret."
	benchSecret      = "BERTH_BENCH_LEASE"
	benchHost        = "lease.bench.invalid"
)

func (r *Runner) leasePause(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "pause-resume-leases", Runtime: rt, Unit: "ms", Definition: defPauseLeases, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	if !r.runtimeInfo(rt).Freeze {
		return fail("the server reports no freezer for " + rt)
	}
	if _, err := r.c.Leases(ctx, "", ""); noRoute(err) {
		return fail("leases have not landed: the server does not serve GET /v1/leases")
	}
	if _, err := r.c.PutSecret(ctx, "", benchSecret, wire.SecretRequest{Host: benchHost, Value: "bench-" + newID("v")}); err != nil {
		return fail("secret: " + err.Error())
	}
	defer func() { _ = r.c.DeleteSecret(context.WithoutCancel(ctx), "", benchSecret) }()
	with, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.Secrets = []string{benchSecret} })
	if err != nil {
		return fail("create with a secret: " + err.Error())
	}
	defer r.remove(ctx, with.ID)
	// The same policy as the granted sandbox (the secret's host allowed):
	// the two differ only in the lease.
	without, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.Allow = []string{benchHost} })
	if err != nil {
		return fail("create: " + err.Error())
	}
	defer r.remove(ctx, without.ID)
	cycle := func(id string) (time.Duration, error) {
		start := time.Now()
		if _, _, err := r.pauseResume(ctx, id, wire.PauseFreeze); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	var base []float64
	var baseErr []string
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		// Which goes first alternates, so neither gains from its place.
		for _, granted := range [][]bool{{true, false}, {false, true}}[i%2] {
			id := without.ID
			if granted {
				id = with.ID
			}
			d, err := cycle(id)
			switch {
			case err != nil && granted:
				m.Errors = append(m.Errors, err.Error())
			case err != nil:
				baseErr = append(baseErr, err.Error())
			case i < r.o.Warmups:
			case granted:
				m.Samples = append(m.Samples, ms(d))
			default:
				base = append(base, ms(d))
			}
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	if ls, err := r.c.Leases(ctx, "", with.ID); err == nil {
		m.Derived = map[string]float64{"generations": float64(len(ls))}
	}
	m.Baseline = baseline("pause + resume without a secret", defPauseNoLeases, base, baseErr)
	return []Metric{m}
}

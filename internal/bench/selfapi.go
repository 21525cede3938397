package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The in-sandbox API's row (docs/STATE.md "Inside the sandbox"): GET
// /v1/sandboxes/self from inside a sandbox, against a REST GET of the same
// sandbox from the bench client, measured in the same run.

const (
	defSelfAPI     = "Inside a running sandbox, `/.berth/berth-agent api --times N GET /v1/sandboxes/self` (one process, one kept-alive connection to the agent's socket /run/berth-agent/api.sock) times each request: the clock starts when the request is sent on the socket and stops when the answer's body has been read: the agent forwards it over a kept-alive caller connection on the sandbox's channel socket, the daemon checks the rate and the sandbox's state, rewrites self to the id, and the REST handler answers as the sandbox (allowlist check, store read). The first 10% of the samples (at least one) are warm-up and dropped. Baseline: GET /v1/sandboxes/{id} of the same sandbox over REST from the bench client (TCP, kept alive), same run."
	defSelfAPIREST = "GET /v1/sandboxes/{id} from the bench client over TCP with a kept-alive connection; the clock starts when the request is sent and stops when the decoded answer is back."
	selfAPISamples = 200
)

// selfAPIRTT measures the in-sandbox API round trip.
func (r *Runner) selfAPIRTT(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "self-api-rtt", Runtime: rt, Unit: "ms", Definition: defSelfAPI, Available: true, Samples: []float64{}}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "create failed: "+err.Error())}
	}
	defer r.remove(ctx, sb.ID)
	n := selfAPISamples // within the per-sandbox burst (200): no request is rate limited
	res, err := r.c.Exec(ctx, sb.ID, "/.berth/berth-agent", "api", "--times", strconv.Itoa(n), "GET", "/v1/sandboxes/self")
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("berth-agent api exited %d: %s", res.ExitCode, strings.TrimSpace(res.Stdout))
	}
	if err != nil {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "the in-sandbox API did not answer (not landed on this server?): "+err.Error())}
	}
	var all []float64
	for _, l := range strings.Fields(res.Stdout) {
		us, err := strconv.ParseFloat(l, 64)
		if err != nil {
			m.Errors = append(m.Errors, "unparsable sample "+strconv.Quote(l))
			continue
		}
		all = append(all, us/1000)
	}
	m.Samples = append(m.Samples, all[min(len(all), max(1, len(all)/10)):]...)
	var base []float64
	var baseErr []string
	for i := 0; i < n && ctx.Err() == nil; i++ {
		start := time.Now()
		_, err := r.c.Sandbox(sb.ID).Get(ctx)
		d := time.Since(start)
		if err != nil {
			baseErr = append(baseErr, err.Error())
			continue
		}
		if i >= max(1, n/10) {
			base = append(base, float64(d.Microseconds())/1000)
		}
	}
	m.Baseline = baseline("REST GET /v1/sandboxes/{id}", defSelfAPIREST, base, baseErr)
	return []Metric{m}
}

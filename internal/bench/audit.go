package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/client"
)

const defAuditVisible = "Clock starts when `exec true` has returned (its exit event read from the exec stream) and stops when " +
	"that exec's `api` entry (route POST /v1/sandboxes/{id}/exec) is returned by GET /v1/audit?sandbox=ID, polled every 2 ms " +
	"(the audit queue, the writer's 10 ms batch linger, hashing, the SQLite commit and the head file's fsync)."

const defAuditVerify = "Clock starts when POST /v1/audit/verify (admin key) is sent and stops when its report has been read: " +
	"a walk of the whole chain (every hash, MAC and link) and both heads; derived per_1k_entries_ms divides by the report's entry count."

// auditVisible is the "audit-visible" row: how soon an API call is in the
// audit chain after it returned.
func (r *Runner) auditVisible(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "audit-visible", Runtime: rt, Unit: "ms", Definition: defAuditVisible, Available: true}
	sb, err := r.create(ctx, rt)
	if err != nil {
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "create failed: "+err.Error())}
	}
	defer r.remove(ctx, sb.ID)
	var after int64
	if _, err := r.c.Audit(ctx, client.AuditOptions{Sandbox: sb.ID, Limit: 1}); err != nil {
		if noRoute(err) {
			return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "the server has no audit chain")}
		}
		return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, "GET /v1/audit failed: "+err.Error())}
	}
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		res, err := r.c.Exec(ctx, sb.ID, "true")
		start := time.Now()
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("true exited %d", res.ExitCode)
		}
		for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			page, err := r.c.Audit(ctx, client.AuditOptions{Sandbox: sb.ID, After: after})
			if err != nil {
				return 0, err
			}
			for _, e := range page.Entries {
				after = e.Seq
				if e.Action == "api" && e.Data["route"] == "POST /v1/sandboxes/{id}/exec" {
					return time.Since(start), nil
				}
			}
		}
		return 0, fmt.Errorf("the exec's entry did not arrive within 10 s")
	})
	return []Metric{m}
}

// auditVerify is the "audit-verify" row: the cost of verifying the chain.
func (r *Runner) auditVerify(ctx context.Context) Metric {
	m := Metric{Name: "audit-verify", Unit: "ms", Definition: defAuditVerify, Available: true}
	var entries int64
	m.Samples, m.Errors = r.measure(ctx, func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		rep, err := r.c.VerifyAudit(ctx)
		if err != nil {
			return 0, err
		}
		d := time.Since(start)
		if !rep.OK {
			return 0, fmt.Errorf("the chain does not verify: %d problems", rep.Total)
		}
		entries = rep.Entries
		return d, nil
	})
	if len(m.Errors) > 0 && len(m.Samples) == 0 && (strings.Contains(m.Errors[0], "no route for") || strings.Contains(m.Errors[0], "only the admin key")) {
		return notAvailable(m.Name, "", m.Unit, m.Definition, "the server has no audit chain (or the key is not the admin's)")
	}
	if entries > 0 {
		m.Derived = map[string]float64{"entries": float64(entries)}
		m.Notes = fmt.Sprintf("chain of %d entries", entries)
	}
	return m
}

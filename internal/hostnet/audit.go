package hostnet

import (
	"context"
	"strconv"

	"github.com/berth-dev/berth/internal/egress"
)

// Auditor records an action in berth's audit chain (docs/STATE.md);
// *audit.Service satisfies it. It must not block.
type Auditor interface {
	Audit(ctx context.Context, actor, action, sandboxID string, data map[string]string)
}

// SetAuditor makes every egress verdict an audit entry; call it before
// Start. Nil: none.
func (h *Service) SetAuditor(a Auditor) { h.auditor = a }

// auditSink tees the proxy's decisions into the audit chain before next:
// every TCP verdict and every DNS denial (allowed DNS answers stay in the
// egress log alone: the connection that follows is audited). The actor is
// the sandbox: it opened the connection.
func (h *Service) auditSink(next func(egress.Decision)) func(egress.Decision) {
	a := h.auditor
	if a == nil {
		return next
	}
	return func(dec egress.Decision) {
		if dec.Proto == "tcp" || dec.Verdict != "allow" {
			d := map[string]string{"proto": dec.Proto, "host": dec.Host, "rule": dec.Rule}
			if dec.DstIP.IsValid() {
				d["dst"] = dec.DstIP.String() + ":" + strconv.Itoa(int(dec.DstPort))
			}
			if dec.Reason != "" {
				d["reason"] = dec.Reason
			}
			if dec.Intercepted {
				d["intercepted"] = "true"
			}
			if dec.Duration > 0 {
				d["duration_ms"] = strconv.FormatInt(dec.Duration.Milliseconds(), 10)
				d["bytes_out"] = strconv.FormatInt(dec.BytesOut, 10)
				d["bytes_in"] = strconv.FormatInt(dec.BytesIn, 10)
			}

			a.Audit(context.Background(), "sandbox:"+dec.SandboxID, "egress."+dec.Verdict, dec.SandboxID, d)
		}
		next(dec)
	}
}

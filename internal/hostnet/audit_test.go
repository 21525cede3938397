package hostnet

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/egress"
)

type auditRec struct {
	actor, action, sandbox string
	data                   map[string]string
}

type recorder struct{ got []auditRec }

func (r *recorder) Audit(_ context.Context, actor, action, sandboxID string, data map[string]string) {
	r.got = append(r.got, auditRec{actor, action, sandboxID, data})
}

// TestAuditSink: every TCP verdict and every DNS denial reach the audit
// chain as the sandbox's; allowed DNS answers do not; the egress log still
// gets every decision.
func TestAuditSink(t *testing.T) {
	rec := &recorder{}
	h := &Service{}
	h.SetAuditor(rec)
	var logged int
	sink := h.auditSink(func(egress.Decision) { logged++ })
	ip := netip.MustParseAddr("203.0.113.7")
	for _, d := range []egress.Decision{
		{SandboxID: "sb1", Proto: "tcp", DstIP: ip, DstPort: 443, Host: "api.test", Rule: "allow:api.test", Verdict: "allow",
			Intercepted: true, BytesOut: 10, BytesIn: 20, Duration: 1500 * time.Millisecond},
		{SandboxID: "sb1", Proto: "tcp", DstIP: ip, DstPort: 22, Rule: "default-deny", Verdict: "deny", Reason: "no-host"},
		{SandboxID: "sb1", Proto: "dns", Host: "ok.test", Rule: "allow:ok.test", Verdict: "allow"},
		{SandboxID: "sb1", Proto: "dns", Host: "evil.test", Rule: "default-deny", Verdict: "deny"},
	} {
		sink(d)
	}
	want := []auditRec{
		{"sandbox:sb1", "egress.allow", "sb1", map[string]string{"proto": "tcp", "host": "api.test", "rule": "allow:api.test",
			"dst": "203.0.113.7:443", "intercepted": "true", "duration_ms": "1500", "bytes_out": "10", "bytes_in": "20"}},
		{"sandbox:sb1", "egress.deny", "sb1", map[string]string{"proto": "tcp", "host": "", "rule": "default-deny",
			"dst": "203.0.113.7:22", "reason": "no-host"}},
		{"sandbox:sb1", "egress.deny", "sb1", map[string]string{"proto": "dns", "host": "evil.test", "rule": "default-deny"}},
	}
	if d := cmp.Diff(want, rec.got, cmp.AllowUnexported(auditRec{})); d != "" {
		t.Errorf("audited (-want +got):\n%s", d)
	}
	if logged != 4 {
		t.Errorf("egress log got %d decisions, want 4", logged)
	}
	if (&Service{}).auditSink(nil) != nil {
		t.Error("without an auditor the sink must be the egress log's own")
	}
}

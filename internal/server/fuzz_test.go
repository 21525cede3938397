package server

import (
	"bytes"
	"math"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/quota"
)

// bodies are the request bodies of /v1 that decode() reads, by name.
var bodies = []func() any{
	func() any { return new(CreateRequest) },
	func() any { return new(ExecRequest) },
	func() any { return new(NetworkRequest) },
	func() any { return new(PortRequest) },
	func() any { return new(PoolRequest) },
	func() any { return new(SecretRequest) },
	func() any { return new(keyRequest) },
	func() any { return new(ttlRequest) },
	func() any { return new(pauseRequest) },
	func() any { return new(leaseRequest) },
	func() any { return new(snapshotRequest) },
	func() any { return new(promoteRequest) },
	func() any { return new(forkRequest) },
	func() any { return new(agentapi.SignalRequest) },
	func() any { return new(agentapi.ResizeRequest) },
	func() any { return new(agentapi.PathRequest) },
	func() any { return new(agentapi.ListRequest) },
	func() any { return new(agentapi.MoveRequest) },
	func() any { return new(quota.Limits) },
}

// FuzzDecodeBodies: any body for any /v1 request type decodes, or fails
// with an InvalidArgument error that names a field (the API promises bad
// input a message naming the field). A create or network body that decodes
// goes on through the policy parser and the TTL parser, as the handlers do.
func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{
		`{"template":"tiny","runtime":"runsc","ttl":"15m","cpu":1.5,"memory_mib":512,"labels":{"a":"b"},"env":{"K":"V"},"network":"rules","allow":["api.github.com:443","10.0.0.0/8"],"deny":["*.evil.test"],"secrets":["TOKEN"]}`,
		`{"cmd":["sh","-c","echo hi"],"env":{"A":"1"},"cwd":"/tmp","user":"root","tty":{"cols":80,"rows":24}}`,
		`{"mode":"allow-all","deny":["198.51.100.0/24:53"]}`,
		`{"ttl":"1d"}`, `{"ttl":1e308}`, `{"ttl":"NaN"}`, `{"mode":"memory"}`,
		`{"template":1}`, `{"nope":true}`, `[]`, `null`, `{"labels":{"a":1}}`, `{`, ``,
	} {
		for i := range bodies {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		v := bodies[int(which)%len(bodies)]()
		err := decode(httptest.NewRequest("POST", "/", bytes.NewReader(body)), v)
		if err != nil {
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) == "" {
				t.Fatalf("decode(%T, %q) = %v (kind %v, field %q); want InvalidArgument naming a field", v, body, err, errs.KindOf(err), errs.FieldOf(err))
			}
			return
		}
		switch req := v.(type) {
		case *CreateRequest:
			checkDuration(t, req.TTL)
			if _, err := egress.ParsePolicy(req.Network, req.Allow, req.Deny); err != nil && errs.FieldOf(err) == "" {
				t.Fatalf("policy error without a field: %v", err)
			}
		case *NetworkRequest:
			if _, err := egress.ParsePolicy(req.Mode, req.Allow, req.Deny); err != nil && errs.FieldOf(err) == "" {
				t.Fatalf("policy error without a field: %v", err)
			}
		}
	})
}

// FuzzParseDuration: a TTL a tenant sends is a finite, non-negative
// duration, or an error.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"15m", "2h30m", "1d", "90", "0.5", "-5", "NaN", "Inf", "1e300", "1e300d", "-1d", "9223372036s", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkDuration(t, s) })
}

func checkDuration(t *testing.T, s string) {
	t.Helper()
	d, err := ParseDuration(s)
	if err != nil {
		return
	}
	if d < 0 || float64(d) >= math.MaxInt64 {
		t.Fatalf("ParseDuration(%q) = %v: a TTL must not be negative or overflow", s, d)
	}
	var jd Duration
	if err := jd.UnmarshalJSON([]byte(`"` + s + `"`)); err == nil && time.Duration(jd) != d {
		t.Fatalf("Duration JSON %q = %v, ParseDuration = %v", s, time.Duration(jd), d)
	}
}

package e2b

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// FuzzCreateBody: any NewSandbox body, as the E2B SDKs (or anyone with a
// key) send it, becomes a create request within the server's limits, or an
// InvalidArgument error.
func FuzzCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"base","timeout":300,"metadata":{"team":"a"},"envVars":{"A":"1"},"allow_internet_access":false}`,
		`{"templateID":"py","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true},"secure":true}`,
		`{"templateID":"base","allow_internet_access":true,"network":{}}`,
		`{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`,
		`{"templateID":"base","timeout":-1}`, `{"templateID":"base","timeout":9223372036854775807}`,
		`{"templateID":""}`, `{"timeout":"x"}`, `[]`, ``,
	} {
		f.Add([]byte(s), false)
	}
	s := New(nil, nil, Options{MaxTimeout: time.Hour})
	f.Fuzz(func(t *testing.T, body []byte, v2 bool) {
		var b newSandboxJSON
		if err := decodeBody(httptest.NewRequest("POST", "/sandboxes", bytes.NewReader(body)), &b); err != nil {
			if errs.KindOf(err) != errs.InvalidArgument {
				t.Fatalf("decode error %v is not InvalidArgument", err)
			}
			return
		}
		req, err := s.createRequest("o", b, v2)
		if err != nil {
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) == "" {
				t.Fatalf("createRequest error %v: want InvalidArgument naming a field", err)
			}
			return
		}
		if req.TTL < 0 || req.TTL > time.Hour || req.Template == "" || req.Owner != "o" {
			t.Fatalf("create request %+v escapes the server's limits", req)
		}
		switch req.Network {
		case "", "deny-all", "allow-all":
		default:
			t.Fatalf("network %q", req.Network)
		}
		if b.AllowInternetAccess != nil && !*b.AllowInternetAccess && req.Network != "deny-all" {
			t.Fatalf("allow_internet_access false became network %q", req.Network)
		}
		if req.ExpiryAction != sandbox.ExpireDelete && req.ExpiryAction != sandbox.ExpirePause {
			t.Fatalf("expiry action %q", req.ExpiryAction)
		}
	})
}

// FuzzDecideRoute: whatever the Host and headers, a request routed to a
// sandbox's envd names a valid sandbox id or none.
func FuzzDecideRoute(f *testing.F) {
	f.Add("49983-abc123.e2b.local:3000", "", "", "", "/files")
	f.Add("api.e2b.local", "abc123-client", "", "", "/health")
	f.Add("localhost", "", "tok", "", "/files")
	f.Add("localhost", "", "", "key", "/v2/sandboxes/abc/pause")
	f.Add("49983-../../etc.x", "a/../b", "", "", "/")
	f.Fuzz(func(t *testing.T, host, sandboxID, token, apiKey, path string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host, r.URL.Path = host, path
		for k, v := range map[string]string{headerSandboxID: sandboxID, headerAccessToken: token, headerAPIKey: apiKey} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		rt := decideRoute(r)
		if rt.SandboxID != "" && (rt.Dest != toEnvd || (!validID(rt.SandboxID) && rt.SandboxID != stripClientID(sandboxID))) {
			t.Fatalf("route %+v for host %q id %q", rt, host, sandboxID)
		}
	})
}

// FuzzMetadataFilter: the list endpoint's metadata query decodes to keys
// and values or an error naming the field.
func FuzzMetadataFilter(f *testing.F) {
	for _, s := range []string{"user%2520id=a%2526b", "a=1&b=2", "%", "=x", "a=%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		m, err := decodeMetadataFilter(raw)
		if err != nil {
			if errs.FieldOf(err) != "metadata" {
				t.Fatalf("error %v does not name metadata", err)
			}
			return
		}
		for k := range m {
			if k == "" {
				t.Fatalf("empty key from %q", raw)
			}
		}
	})
}

// FuzzProcessEvent: any event the agent (the tenant) sends translates to
// an E2B process event, an error, or nothing, and only exit and error end
// the stream.
func FuzzProcessEvent(f *testing.F) {
	for _, s := range []string{`{"type":"start","pid":7}`, `{"type":"stdout","data":"aGk="}`, `{"type":"pty","data":""}`,
		`{"type":"exit","exit_code":-1,"exited":false,"status":"signal: killed"}`, `{"type":"exit","error":"timeout"}`,
		`{"type":"error","error":"x"}`, `{"type":"future"}`, `{"type":"start","pid":-5}`} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, ownsTimeout bool) {
		var ev agentapi.Event
		if json.Unmarshal(b, &ev) != nil {
			return
		}
		out, done, err := processEvent(ev, ownsTimeout)
		if done != (ev.Type == "exit" || ev.Type == "error") {
			t.Fatalf("event %+v: done = %v", ev, done)
		}
		if err == nil && out == nil && ev.Type != "exit" && ev.Type != "error" {
			return // unknown types are skipped
		}
		if err == nil && out == nil {
			t.Fatalf("event %+v: neither an event nor an error", ev)
		}
		if out != nil && out.GetEnd() != nil {
			end := out.GetEnd()
			if (end.GetExitCode() != 0 || !end.GetExited()) && end.Error == nil {
				t.Fatalf("unclean end %+v without an error", end)
			}
		}
	})
}

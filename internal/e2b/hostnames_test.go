package e2b

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/sandboxca"
)

func TestParseSandboxHost(t *testing.T) {
	const d = "berth.localhost"
	tests := []struct {
		host    string
		want    hostTarget
		ok      bool
		errPart string // "" = no error
	}{
		{host: "49983-abc123.berth.localhost", want: hostTarget{"abc123", "49983"}, ok: true},
		{host: "8000-abc123.berth.localhost:443", want: hostTarget{"abc123", "8000"}, ok: true},
		{host: "8000-ABC123.Berth.Localhost.", want: hostTarget{"abc123", "8000"}, ok: true},
		{host: "65535-a.berth.localhost", want: hostTarget{"a", "65535"}, ok: true},
		{host: "1-a-6532622b.berth.localhost", want: hostTarget{"a", "1"}, ok: true},
		{host: "api.berth.localhost", ok: false},
		{host: "berth.localhost", ok: false},
		{host: "127.0.0.1:3000", ok: false},
		{host: "8000-abc.other.example", ok: false},
		{host: "8000-abc.xberth.localhost", ok: false},
		{host: "0-abc.berth.localhost", ok: true, errPart: "port"},
		{host: "65536-abc.berth.localhost", ok: true, errPart: "port"},
		{host: "080-abc.berth.localhost", ok: true, errPart: "port"},
		{host: "+80-abc.berth.localhost", ok: true, errPart: "port"},
		{host: "http-abc.berth.localhost", ok: true, errPart: "port"},
		{host: "8000.berth.localhost", ok: true, errPart: "no '-'"},
		{host: "8000-.berth.localhost", ok: true, errPart: "sandbox id"},
		{host: "8000-a_b.berth.localhost", ok: true, errPart: "sandbox id"},
		{host: "8000-" + strings.Repeat("a", 65) + ".berth.localhost", ok: true, errPart: "sandbox id"},
		{host: "8000-abc-x_y.berth.localhost", ok: true, errPart: "client id"},
		{host: "a.8000-abc.berth.localhost", ok: true, errPart: "one label"},
		{host: ".berth.localhost", ok: true, errPart: "one label"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, ok, err := parseSandboxHost(tt.host, d)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (err %v)", ok, tt.ok, err)
			}
			if tt.errPart == "" {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.errPart) || errs.FieldOf(err) != "host" || !errs.Is(err, errs.InvalidArgument) {
				t.Fatalf("err = %v (field %q), want InvalidArgument on field host mentioning %q", err, errs.FieldOf(err), tt.errPart)
			}
		})
	}
	if _, ok, err := parseSandboxHost("8000-abc.berth.localhost", ""); ok || err != nil {
		t.Fatal("no domain configured must route nothing by host name")
	}
}

// TestHostRoutedPorts serves the E2B surface over TLS with berth's CA and
// fetches sandbox ports by host name, as sbx.getHost(port) does: the
// sandbox's tokens and its owner's API key are let through, anything else
// is refused without dialing the sandbox; the host name, the TLS server
// name and the routing headers must agree.
func TestHostRoutedPorts(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What reached the sandbox: none of the credentials.
		for _, h := range []string{headerAPIKey, headerAccessToken, headerTrafficToken} {
			if r.Header.Get(h) != "" {
				http.Error(w, h+" leaked to the sandbox", 500)
				return
			}
		}
		io.WriteString(w, "hello from "+r.Host+r.URL.Path)
	}))
	defer upstream.Close()
	now := time.Now()
	b, envd := newPortBackend(t,
		&sandbox.Sandbox{ID: "sbxa", Owner: "alice", State: sandbox.Running, StartedAt: now, CreatedAt: now},
		&sandbox.Sandbox{ID: "sbxb", Owner: "bob", State: sandbox.Running, StartedAt: now, CreatedAt: now},
		&sandbox.Sandbox{ID: "sbxp", Owner: "alice", State: sandbox.Paused, StartedAt: now, CreatedAt: now})
	aliceKey, err := b.auth.CreateKey(t.Context(), "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	bobKey, err := b.auth.CreateKey(t.Context(), "bob", false)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, id, port string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, id+":"+port)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", upstream.Listener.Addr().String())
	}
	const domain = "berth.localhost"
	s := New(b, slog.New(slog.DiscardHandler), Options{Domain: domain, DialPort: dial, PortWait: time.Second})
	client, do := hostFront(t, s, domain)

	host := "8000-sbxa." + domain
	for name, hdr := range map[string]map[string]string{
		"traffic token": {headerTrafficToken: trafficToken(envd["sbxa"])},
		"envd token":    {headerAccessToken: envd["sbxa"]},
		"owner's key":   {headerAPIKey: aliceKey},
	} {
		if code, body := do(host, hdr); code != 200 || body != "hello from "+host+"/index.html" {
			t.Errorf("%s: %d %q", name, code, body)
		}
	}
	mu.Lock()
	n := len(dialed)
	mu.Unlock()

	for name, tc := range map[string]struct {
		host string
		hdr  map[string]string
		code int
	}{
		"no credentials":                {host, nil, 401},
		"other owner's key":             {host, map[string]string{headerAPIKey: bobKey}, 401},
		"made-up key":                   {host, map[string]string{headerAPIKey: "e2b_00"}, 401},
		"other sandbox's traffic token": {host, map[string]string{headerTrafficToken: trafficToken(envd["sbxb"])}, 401},
		"header names another sandbox":  {host, map[string]string{headerSandboxID: "sbxb", headerAccessToken: envd["sbxb"]}, 400},
		"header names another port":     {host, map[string]string{headerSandboxPort: "9000", headerAccessToken: envd["sbxa"]}, 400},
		"bad port label":                {"99999-sbxa." + domain, map[string]string{headerAccessToken: envd["sbxa"]}, 400},
		"unknown sandbox":               {"8000-nosuch." + domain, map[string]string{headerAPIKey: aliceKey}, 502},
		"paused without auto-resume":    {"8000-sbxp." + domain, map[string]string{headerAPIKey: aliceKey}, 502},
	} {
		if code, body := do(tc.host, tc.hdr); code != tc.code {
			t.Errorf("%s: %d %q, want %d", name, code, body, tc.code)
		}
	}
	mu.Lock()
	if len(dialed) != n {
		t.Errorf("refused requests dialed the sandbox: %v", dialed[n:])
	}
	mu.Unlock()

	// Header-routed (E2B_SANDBOX_URL style, here on api.<domain>), the
	// owner's key is no port credential: only the sandbox's tokens are.
	if code, body := do("api."+domain, map[string]string{headerSandboxID: "sbxa", headerSandboxPort: "8000", headerAPIKey: aliceKey}); code != 401 {
		t.Errorf("header-routed port with the owner's key: %d %q, want 401", code, body)
	}
	mu.Lock()
	if len(dialed) != n {
		t.Errorf("refused requests dialed the sandbox: %v", dialed[n:])
	}
	mu.Unlock()

	// api.<domain> is berth's own API (and the control plane).
	if code, body := do("api."+domain, nil); code != 200 || body != "berth api" {
		t.Errorf("api host: %d %q", code, body)
	}
	// A name outside the domain gets no certificate: the handshake fails.
	if code, body := do("www.example.com", nil); code != 0 {
		t.Errorf("outside the domain: %d %q, want a failed handshake", code, body)
	}
	// A Host that disagrees with the TLS server name is refused (421).
	req, _ := http.NewRequest("GET", "https://"+host+"/", nil)
	req.Host = "8000-sbxb." + domain
	req.Header.Set(headerAccessToken, envd["sbxb"])
	if res, err := client.Do(req); err != nil || res.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("host/SNI mismatch: %v %v", res, err)
	} else {
		res.Body.Close()
	}
}

// stuckResume is a backend whose resume of an auto-resume sandbox never
// finishes: Agent waits for its context.
type stuckResume struct{ *portBackend }

func (b stuckResume) Agent(ctx context.Context, owner, id string) (*agentapi.Client, error) {
	sb, err := b.Get(ctx, owner, id)
	if err == nil && sb.State == sandbox.Paused && sb.AutoResume {
		<-ctx.Done()
		return nil, errs.Wrap(errs.Unavailable, ctx.Err(), "resume sandbox %s", id)
	}
	return b.portBackend.Agent(ctx, owner, id)
}

// TestAutoResumeWaitIsBounded: a request to a paused auto-resume sandbox
// whose resume hangs answers E2B's 502 after ResumeWait, by host name and
// by header, and never dials the sandbox.
func TestAutoResumeWaitIsBounded(t *testing.T) {
	now := time.Now()
	b, envd := newPortBackend(t,
		&sandbox.Sandbox{ID: "sbxr", Owner: "alice", State: sandbox.Paused, AutoResume: true, StartedAt: now, CreatedAt: now})
	dialed := false
	dial := func(ctx context.Context, id, port string) (net.Conn, error) {
		dialed = true
		return nil, errs.E(errs.Unavailable, "no")
	}
	s := New(stuckResume{b}, slog.New(slog.DiscardHandler), Options{Domain: "berth.localhost", DialPort: dial, ResumeWait: 200 * time.Millisecond})
	front := httptest.NewServer(s.Handler(http.NotFoundHandler()))
	defer front.Close()
	for name, hdr := range map[string]map[string]string{
		"host":   {"Host": "8000-sbxr.berth.localhost"},
		"header": {headerSandboxID: "sbxr", headerSandboxPort: "8000"},
		"envd":   {"Host": "49983-sbxr.berth.localhost"},
	} {
		req, _ := http.NewRequest("GET", front.URL+"/", nil)
		req.Header.Set(headerAccessToken, envd["sbxr"])
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		start := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if took := time.Since(start); res.StatusCode != http.StatusBadGateway || took > 10*time.Second {
			t.Errorf("%s: %d %s after %s, want 502 after the 200ms resume wait", name, res.StatusCode, body, took)
		}
		if !strings.Contains(string(body), `"sandboxId":"sbxr"`) {
			t.Errorf("%s: body %s is not E2B's router error", name, body)
		}
	}
	if dialed {
		t.Error("a sandbox whose resume did not finish was dialed")
	}
}

// hostFront serves s's handler over TLS with a sandbox CA for domain and
// returns a client that resolves every name to it, and do, which GETs
// https://<host>/index.html with headers hdr.
func hostFront(t *testing.T, s *Server, domain string) (*http.Client, func(host string, hdr map[string]string) (int, string)) {
	t.Helper()
	ca, err := sandboxca.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	is, err := sandboxca.NewIssuer(ca, domain)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(s.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "berth api")
	})))
	front.TLS = is.TLSConfig()
	front.StartTLS()
	t.Cleanup(front.Close)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: true,
		// Every name resolves to the test server, as *.localhost does to loopback.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, front.Listener.Addr().String())
		},
	}}
	do := func(host string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+host+"/index.html", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	return client, do
}

// TestPublicTraffic: a sandbox created with allowPublicTraffic: true has
// its host-routed user ports open without a credential; its envd still
// needs its token, header-routed requests keep their rule, and another
// (private) sandbox of the same owner gains nothing from it.
func TestPublicTraffic(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, h := range []string{headerAPIKey, headerAccessToken, headerTrafficToken} {
			if r.Header.Get(h) != "" {
				http.Error(w, h+" leaked to the sandbox", 500)
				return
			}
		}
		io.WriteString(w, "hello from "+r.Host+r.URL.Path)
	}))
	defer upstream.Close()
	now := time.Now()
	pub := &sandbox.Sandbox{ID: "sbxpub", Owner: "alice", State: sandbox.Running, StartedAt: now, CreatedAt: now}
	pub.PublicTraffic = true
	b, envd := newPortBackend(t, pub,
		&sandbox.Sandbox{ID: "sbxpriv", Owner: "alice", State: sandbox.Running, StartedAt: now, CreatedAt: now})
	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, id, port string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, id+":"+port)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", upstream.Listener.Addr().String())
	}
	const domain = "berth.localhost"
	s := New(b, slog.New(slog.DiscardHandler), Options{Domain: domain, DialPort: dial, PortWait: time.Second})
	_, do := hostFront(t, s, domain)

	for _, host := range []string{"8000-sbxpub." + domain, "6080-sbxpub." + domain} {
		if code, body := do(host, nil); code != 200 || body != "hello from "+host+"/index.html" {
			t.Errorf("public port %s without credentials: %d %q, want 200 relayed", host, code, body)
		}
		// A credential sent anyway is stripped (the upstream answers 500 if not).
		if code, body := do(host, map[string]string{headerAccessToken: envd["sbxpub"]}); code != 200 {
			t.Errorf("public port %s with the envd token: %d %q", host, code, body)
		}
	}
	mu.Lock()
	if len(dialed) != 4 || dialed[0] != "sbxpub:8000" || dialed[2] != "sbxpub:6080" {
		t.Errorf("dialed %v, want the public sandbox's ports", dialed)
	}
	n := len(dialed)
	mu.Unlock()

	for name, tc := range map[string]struct {
		host string
		hdr  map[string]string
	}{
		"public sandbox's envd":              {"49983-sbxpub." + domain, nil},
		"public sandbox's envd, other token": {"49983-sbxpub." + domain, map[string]string{headerAccessToken: envd["sbxpriv"]}},
		"private sandbox's port":             {"8000-sbxpriv." + domain, nil},
		"private port, public's token":       {"8000-sbxpriv." + domain, map[string]string{headerAccessToken: envd["sbxpub"]}},
		"private port, public's traffic":     {"8000-sbxpriv." + domain, map[string]string{headerTrafficToken: trafficToken(envd["sbxpub"])}},
		"header-routed to the public port":   {"api." + domain, map[string]string{headerSandboxID: "sbxpub", headerSandboxPort: "8000"}},
	} {
		if code, body := do(tc.host, tc.hdr); code != 401 {
			t.Errorf("%s: %d %q, want 401", name, code, body)
		}
	}
	mu.Lock()
	if len(dialed) != n {
		t.Errorf("refused requests dialed a sandbox: %v", dialed[n:])
	}
	mu.Unlock()
	// The private sandbox keeps today's rule: its own token works.
	if code, body := do("8000-sbxpriv."+domain, map[string]string{headerTrafficToken: trafficToken(envd["sbxpriv"])}); code != 200 {
		t.Errorf("private port with its traffic token: %d %q", code, body)
	}
}

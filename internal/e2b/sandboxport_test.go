package e2b

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

func TestTrafficToken(t *testing.T) {
	a, b := trafficToken("envd-token-a"), trafficToken("envd-token-b")
	if a == b || !strings.HasPrefix(a, trafficTokenPrefix) || len(a) != len(trafficTokenPrefix)+48 {
		t.Fatalf("trafficToken: %q %q", a, b)
	}
	if a != trafficToken("envd-token-a") {
		t.Fatal("trafficToken is not deterministic")
	}
	if strings.Contains(a, "envd-token-a") {
		t.Fatal("traffic token contains the envd token")
	}
	if trafficToken("") != "" {
		t.Fatal("no envd token must give no traffic token")
	}
}

// portBackend serves sandboxes (by id) for the port relay, with a real
// auth service over a real store for their envd tokens; the rest of
// Backend is agentBackend's "unused" answers.
type portBackend struct {
	agentBackend
	mu  sync.Mutex
	sbs map[string]*sandbox.Sandbox // by id
}

// newPortBackend stores sbs and returns the backend and each sandbox's
// envd access token (derived by auth, as the daemon hands them out).
func newPortBackend(t *testing.T, sbs ...*sandbox.Sandbox) (*portBackend, map[string]string) {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := auth.New(st, t.TempDir(), time.Now, bytes.Repeat([]byte{9}, auth.TokenKeySize))
	b := &portBackend{agentBackend: agentBackend{st: st, auth: a}, sbs: map[string]*sandbox.Sandbox{}}
	tok := map[string]string{}
	for _, sb := range sbs {
		sb.Template, sb.AccessTokenHash = "default", a.EnvdTokenHash(sb.ID, sb.Owner)
		if err := st.CreateSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		if tok[sb.ID], err = a.EnvdToken(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		b.sbs[sb.ID] = sb
	}
	return b, tok
}

func (b *portBackend) Get(_ context.Context, _, id string) (*sandbox.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.sbs[id]
	if !ok {
		return nil, errs.E(errs.NotFound, "sandbox %s not found", id)
	}
	c := *sb
	return &c, nil
}

func (b *portBackend) Agent(_ context.Context, _, id string) (*agentapi.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sb, ok := b.sbs[id]; !ok || sb.State != sandbox.Running {
		return nil, errs.E(errs.Unavailable, "sandbox %s is not running", id)
	}
	return nil, nil
}

func TestSandboxPortRelay(t *testing.T) {
	var mu sync.Mutex
	var seen http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, `{"n":%d,"path":%q,"body":%q}`+"\n", i, r.URL.Path, body)
			w.(http.Flusher).Flush()
		}
	}))
	defer upstream.Close()
	closed, _ := net.Listen("tcp4", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close() // nothing listens here: refused

	now := time.Now()
	b, envd := newPortBackend(t,
		&sandbox.Sandbox{ID: "sbxa", Owner: "alice", State: sandbox.Running, StartedAt: now.Add(-time.Hour), CreatedAt: now.Add(-time.Hour)},
		&sandbox.Sandbox{ID: "sbxb", Owner: "alice", State: sandbox.Running, StartedAt: now.Add(-time.Hour), CreatedAt: now.Add(-time.Hour)},
		&sandbox.Sandbox{ID: "sbxp", Owner: "alice", State: sandbox.Paused, StartedAt: now.Add(-time.Hour), CreatedAt: now.Add(-time.Hour)})
	var dialed []string
	dial := func(ctx context.Context, id, port string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, id+":"+port)
		mu.Unlock()
		addr := upstream.Listener.Addr().String()
		if port == "49998" {
			addr = closedAddr
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", addr)
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, err, "dial sandbox port %s", port)
		}
		return c, nil
	}
	s := New(b, slog.New(slog.DiscardHandler), Options{DialPort: dial, PortWait: time.Second})
	front := httptest.NewServer(s.Handler(http.NotFoundHandler()))
	defer front.Close()

	do := func(id, port string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", front.URL+"/execute", strings.NewReader(`{"code":"1+1"}`))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", port)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}

	refused := []struct {
		name string
		hdr  map[string]string
	}{
		{"no token", nil},
		{"forged traffic token", map[string]string{"E2B-Traffic-Access-Token": "btt_forged"}},
		{"other sandbox's envd token", map[string]string{"X-Access-Token": envd["sbxb"]}},
		{"other sandbox's traffic token", map[string]string{"E2B-Traffic-Access-Token": trafficToken(envd["sbxb"])}},
		{"envd token as traffic token", map[string]string{"E2B-Traffic-Access-Token": envd["sbxa"]}},
		{"api key", map[string]string{"X-API-Key": "some-key"}},
	}
	for _, tt := range refused {
		if code, body := do("sbxa", "49999", tt.hdr); code != http.StatusUnauthorized {
			t.Errorf("%s: status %d (%s), want 401", tt.name, code, body)
		}
	}
	mu.Lock()
	if len(dialed) != 0 {
		t.Errorf("refused requests dialed the sandbox: %v", dialed)
	}
	mu.Unlock()

	for _, hdr := range []map[string]string{
		{"E2B-Traffic-Access-Token": trafficToken(envd["sbxa"])},
		{"X-Access-Token": envd["sbxa"]},
	} {
		code, body := do("sbxa", "49999", hdr)
		if code != http.StatusOK {
			t.Fatalf("%v: status %d (%s)", hdr, code, body)
		}
		sc := bufio.NewScanner(strings.NewReader(body))
		n := 0
		for sc.Scan() {
			want := fmt.Sprintf(`{"n":%d,"path":"/execute","body":"{\"code\":\"1+1\"}"}`, n)
			if sc.Text() != want {
				t.Errorf("line %d = %s, want %s", n, sc.Text(), want)
			}
			n++
		}
		if n != 3 {
			t.Errorf("%d lines relayed, want 3: %q", n, body)
		}
		mu.Lock()
		for _, h := range []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Access-Token", "E2B-Traffic-Access-Token", "X-Api-Key"} {
			if v := seen.Get(h); v != "" {
				t.Errorf("header %s reached the sandbox: %q", h, v)
			}
		}
		mu.Unlock()
	}
	mu.Lock()
	if len(dialed) != 2 || dialed[0] != "sbxa:49999" {
		t.Errorf("dialed %v, want sbxa:49999 twice", dialed)
	}
	mu.Unlock()

	tok := map[string]string{"E2B-Traffic-Access-Token": trafficToken(envd["sbxa"])}
	for _, port := range []string{"0", "65536", "http", "049999"} {
		if code, body := do("sbxa", port, tok); code != http.StatusBadRequest {
			t.Errorf("port %q: status %d (%s), want 400", port, code, body)
		}
	}
	// Nothing listening, sandbox started long ago: E2B's 502 at once.
	start := time.Now()
	if code, body := do("sbxa", "49998", tok); code != http.StatusBadGateway || !strings.Contains(body, "port is not open") {
		t.Errorf("closed port: status %d (%s), want 502", code, body)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("closed port of an old sandbox took %s (no retry expected)", d)
	}
	if code, _ := do("sbxp", "49999", map[string]string{"X-Access-Token": envd["sbxp"]}); code != http.StatusBadGateway {
		t.Errorf("paused sandbox: status %d, want 502", code)
	}
	if code, _ := do("nosuch", "49999", tok); code != http.StatusBadGateway {
		t.Errorf("unknown sandbox: status %d, want 502", code)
	}
}

// A sandbox that has just started gets refused dials retried until its
// server listens (the template's start command may still be binding it).
func TestSandboxPortWaitsForAFreshServer(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	defer up.Close()
	b, envd := newPortBackend(t,
		&sandbox.Sandbox{ID: "sbxa", Owner: "alice", State: sandbox.Running, StartedAt: time.Now(), CreatedAt: time.Now()})
	listening := time.Now().Add(300 * time.Millisecond)
	var refusals int
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		if time.Now().Before(listening) {
			refusals++
			return nil, errs.Wrap(errs.Unavailable, &net.OpError{Op: "dial", Net: "tcp4", Err: syscall.ECONNREFUSED}, "dial sandbox port")
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", up.Listener.Addr().String())
	}
	s := New(b, nil, Options{DialPort: dial, PortWait: 10 * time.Second})
	front := httptest.NewServer(s.Handler(nil))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", "sbxa")
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", envd["sbxa"])
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != "up" || refusals == 0 {
		t.Fatalf("status %d body %q after %d refusals, want 200 up after some", res.StatusCode, body, refusals)
	}
}

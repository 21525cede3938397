package bench

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The effects-row client keeps one connection, sends a new key per
// request, verifies the server against the CAs it is given, and prints
// one timing and Berth-Effect per request.
func TestHTTPSClient(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	conns := map[string]bool{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		conns[r.RemoteAddr] = true
		mu.Unlock()
		w.Header().Set("Berth-Effect", "ef1")
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := RunHTTPSClient([]string{"--ca", ca, "--n", "3", "--key", "k", srv.URL + "/v1/charges"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], " ef1") {
		t.Fatalf("client printed %q; want 3 lines of timing and effect", out.String())
	}
	if strings.Join(keys, ",") != "k-0,k-1,k-2" || len(conns) != 1 {
		t.Fatalf("keys %v over %d connections; want k-0..k-2 on one", keys, len(conns))
	}
	// Without the server's CA the client refuses it.
	if err := RunHTTPSClient([]string{"--n", "1", srv.URL}, &out); err == nil {
		t.Fatal("the client trusted a server whose CA it was not given")
	}
}

package peer

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestVerify(t *testing.T) {
	tok := NewToken()
	mk := func(h map[string]string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return r
	}
	signed := httptest.NewRequest("GET", "/", nil)
	Sign(signed, tok, Principal{Owner: "alice"})
	if p, ok, err := Verify(signed, tok); err != nil || !ok || p.Owner != "alice" || p.Admin {
		t.Fatalf("signed: %+v %v %v", p, ok, err)
	}
	if _, ok, err := Verify(mk(nil), tok); ok || err != nil {
		t.Fatalf("plain request: ok=%v err=%v, want neither", ok, err)
	}
	for name, h := range map[string]map[string]string{
		"wrong token":           {HeaderToken: NewToken(), HeaderPrincipal: `{"owner":"alice"}`},
		"principal alone":       {HeaderPrincipal: `{"owner":"alice","admin":true}`},
		"id alone":              {HeaderSandboxID: "abc"},
		"token, no principal":   {HeaderToken: tok},
		"token, bad principal":  {HeaderToken: tok, HeaderPrincipal: `{"owner":`},
		"token, empty owner":    {HeaderToken: tok, HeaderPrincipal: `{"owner":""}`},
		"token, huge principal": {HeaderToken: tok, HeaderPrincipal: `{"owner":"` + strings.Repeat("a", 5000) + `"}`},
	} {
		if _, ok, err := Verify(mk(h), tok); ok || !errs.Is(err, errs.Unauthenticated) {
			t.Errorf("%s: ok=%v err=%v, want Unauthenticated", name, ok, err)
		}
	}
	// Single host (no token): a cluster header is refused, never trusted.
	if _, ok, err := Verify(signed, ""); ok || !errs.Is(err, errs.Unauthenticated) {
		t.Fatalf("no cluster token configured: ok=%v err=%v", ok, err)
	}
	h := signed.Header.Clone()
	h.Set(HeaderSandboxID, "x")
	Strip(h)
	if h.Get(HeaderToken)+h.Get(HeaderPrincipal)+h.Get(HeaderSandboxID) != "" {
		t.Fatalf("Strip left %v", h)
	}
}

// A replica talks only to the node whose certificate hash the Node
// object published.
func TestPinnedTransport(t *testing.T) {
	dir := t.TempDir()
	id, err := LoadOrCreateIdentity(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreateIdentity(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "node") }))
	srv.TLS = id.ServerTLS()
	srv.StartTLS()
	defer srv.Close()
	get := func(pin string) error {
		c := &http.Client{Transport: Transport(pin)}
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(id.SHA256); err != nil {
		t.Fatalf("pinned to the node's hash: %v", err)
	}
	if err := get(other.SHA256); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("pinned to another hash: %v, want a mismatch", err)
	}
	if err := get(""); err == nil {
		t.Fatal("no pin: connected")
	}
	// The identity is stable across restarts (the Node keeps its hash).
	again, err := LoadOrCreateIdentity(dir, nil)
	if err != nil || again.SHA256 != id.SHA256 {
		t.Fatalf("reloaded identity: %v, hash %s want %s", err, again.SHA256, id.SHA256)
	}
}

package auth

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
)

// TestClusterPrincipal attacks the cluster hook: a replica's signed request
// acts as the principal it names; a forged or wrong token, a principal
// without the token, a chosen id without the token, and any cluster header
// on a single-host daemon (no token) are refused; a request with no
// cluster header still authenticates by its key.
func TestClusterPrincipal(t *testing.T) {
	a, _, _ := testService(t)
	key, err := a.CreateKey(t.Context(), "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	tok := peer.NewToken()
	cases := []struct {
		name    string
		token   string // the node's
		sign    string // the replica's ("" = unsigned)
		p       peer.Principal
		extra   map[string]string
		want    Principal
		wantErr bool
		useKey  bool
	}{
		{name: "signed", token: tok, sign: tok, p: peer.Principal{Owner: "bob"}, want: Principal{Owner: "bob", Cluster: true}},
		{name: "signed admin", token: tok, sign: tok, p: peer.Principal{Admin: true}, want: Principal{Admin: true, Cluster: true}},
		{name: "wrong token", token: tok, sign: peer.NewToken(), p: peer.Principal{Owner: "bob"}, wantErr: true},
		{name: "feature off", token: "", sign: tok, p: peer.Principal{Owner: "bob"}, wantErr: true},
		{name: "principal without token", token: tok, extra: map[string]string{peer.HeaderPrincipal: `{"owner":"bob"}`}, wantErr: true},
		{name: "id without token", token: tok, extra: map[string]string{peer.HeaderSandboxID: "abc"}, useKey: true, wantErr: true},
		{name: "bad owner", token: tok, sign: tok, p: peer.Principal{Owner: "Bob/../x"}, wantErr: true},
		{name: "key only", token: tok, useKey: true, want: Principal{Owner: "alice"}},
		{name: "key only, feature off", token: "", useKey: true, want: Principal{Owner: "alice"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a.SetClusterToken(c.token)
			r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
			if c.sign != "" {
				peer.Sign(r, c.sign, c.p)
			}
			for k, v := range c.extra {
				r.Header.Set(k, v)
			}
			k := ""
			if c.useKey {
				k = key
			}
			got, err := a.Request(r, k)
			if c.wantErr {
				if !errs.Is(err, errs.Unauthenticated) {
					t.Fatalf("got %+v, %v; want Unauthenticated", got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// TestGivenSandboxID: only a verified request chooses the id, and a bad
// one names the header.
func TestGivenSandboxID(t *testing.T) {
	r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
	r.Header.Set(peer.HeaderSandboxID, "abc123")
	if id, err := GivenSandboxID(r, Principal{Owner: "bob"}); id != "" || err != nil {
		t.Fatalf("unverified: got %q, %v", id, err)
	}
	if id, err := GivenSandboxID(r, Principal{Owner: "bob", Cluster: true}); id != "abc123" || err != nil {
		t.Fatalf("verified: got %q, %v", id, err)
	}
	r.Header.Set(peer.HeaderSandboxID, "ABC-../x")
	if _, err := GivenSandboxID(r, Principal{Owner: "bob", Cluster: true}); errs.FieldOf(err) != peer.HeaderSandboxID {
		t.Fatalf("bad id: got %v, want a field error naming %s", err, peer.HeaderSandboxID)
	}
}

// TestClusterGate: forged cluster headers are refused before any route;
// a request without them, or correctly signed, passes.
func TestClusterGate(t *testing.T) {
	a, _, _ := testService(t)
	tok := peer.NewToken()
	a.SetClusterToken(tok)
	g := a.ClusterGate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for _, c := range []struct {
		name string
		mod  func(r *http.Request)
		want int
	}{
		{"plain", func(*http.Request) {}, http.StatusTeapot},
		{"signed", func(r *http.Request) { peer.Sign(r, tok, peer.Principal{Owner: "bob"}) }, http.StatusTeapot},
		{"forged", func(r *http.Request) { peer.Sign(r, peer.NewToken(), peer.Principal{Owner: "bob"}) }, http.StatusUnauthorized},
		{"id alone", func(r *http.Request) { r.Header.Set(peer.HeaderSandboxID, "x") }, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest("GET", "/envd/health", nil)
		c.mod(r)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s: %d, want %d", c.name, w.Code, c.want)
		}
	}
}

package e2b

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Vectors from the SDK's own getSignature (e2b 2.51.0, exported), run in node.
func TestFileSignatureMatchesSDK(t *testing.T) {
	for _, c := range []struct {
		path, op, user, token string
		exp                   int64
		want                  string
	}{
		{"/home/user/a.txt", "read", "", "tok", 1700000000, "v1_xFHydXA5wOSaKG1rIbypk15/DrqiTa4AE+MfKbAW4Hs"},
		{"/home/user/a b+c.txt", "write", "root", "tok", 0, "v1_zSdyKmdEcIQN3sEUgPKPCq1K7MbDQsT/S1zSDRxm+lk"},
	} {
		if got := fileSignature(c.path, c.op, c.user, c.token, c.exp); got != c.want {
			t.Errorf("fileSignature(%q, %s, %q) = %s, want %s", c.path, c.op, c.user, got, c.want)
		}
	}
}

func TestSignedParams(t *testing.T) {
	const tok = "tok"
	now := time.Unix(1700000000, 0)
	good := url.Values{"path": {"/home/user/a.txt"}, "signature": {fileSignature("/home/user/a.txt", "read", "", tok, 1700000060)}, "signature_expiration": {"1700000060"}}
	with := func(k, v string) url.Values {
		q := url.Values{}
		for kk, vv := range good {
			q[kk] = vv
		}
		if v == "" {
			q.Del(k)
		} else {
			q.Set(k, v)
		}
		return q
	}
	for _, c := range []struct {
		name    string
		method  string
		q       url.Values
		at      time.Time
		match   bool
		expired bool
		field   string
	}{
		{name: "valid download", method: http.MethodGet, q: good, at: now, match: true},
		{name: "expired", method: http.MethodGet, q: good, at: now.Add(61 * time.Second), match: true, expired: true},
		{name: "as an upload", method: http.MethodPost, q: good, at: now},
		{name: "other path", method: http.MethodGet, q: with("path", "/etc/shadow"), at: now},
		{name: "other user", method: http.MethodGet, q: with("username", "root"), at: now},
		{name: "expiration stripped", method: http.MethodGet, q: with("signature_expiration", ""), at: now},
		{name: "expiration extended", method: http.MethodGet, q: with("signature_expiration", "1800000000"), at: now},
		{name: "expiration not a number", method: http.MethodGet, q: with("signature_expiration", "soon"), field: "signature_expiration"},
		{name: "tampered signature", method: http.MethodGet, q: with("signature", "v1_AAAA"), at: now},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := parseSigned(c.method, c.q)
			if c.field != "" {
				if errs.FieldOf(err) != c.field {
					t.Fatalf("err = %v, want a %s field error", err, c.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.matches(tok); got != c.match {
				t.Fatalf("matches = %v, want %v", got, c.match)
			}
			if got := p.expired(c.at); got != c.expired {
				t.Fatalf("expired = %v, want %v", got, c.expired)
			}
			if p.matches("another sandbox's token") {
				t.Fatal("signature matches another token")
			}
		})
	}
}

func TestSignedFilesRoute(t *testing.T) {
	r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/files?path=a&signature=v1_x", nil)
	if got := decideRoute(r); got.Dest != toEnvd || got.SandboxID != "" {
		t.Errorf("signed GET /files routed %+v, want envd by signature", got)
	}
	r, _ = http.NewRequest(http.MethodGet, "http://127.0.0.1/files?path=a", nil)
	if got := decideRoute(r); got.Dest == toEnvd {
		t.Errorf("unsigned /files without a token routed to envd")
	}
	r, _ = http.NewRequest(http.MethodDelete, "http://127.0.0.1/files?path=a&signature=v1_x", nil)
	if got := decideRoute(r); got.Dest == toEnvd {
		t.Errorf("DELETE /files with a signature routed to envd")
	}
}

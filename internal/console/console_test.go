package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
)

// keys is a real map of API keys standing in for auth.Service, which needs
// a store; the console only asks "whose key is this".
type keys map[string]auth.Principal

func (k keys) Authenticate(_ context.Context, key string) (auth.Principal, error) {
	if p, ok := k[key]; ok {
		return p, nil
	}
	return auth.Principal{}, errs.E(errs.Unauthenticated, "invalid API key")
}

func TestCheck(t *testing.T) {
	const tok = "tok123"
	for _, tc := range []struct {
		name string
		req  Request
		want errs.Kind // 0: allowed
	}{
		{"get without header", Request{Method: "GET", Host: "h:1"}, 0},
		{"get same-origin", Request{Method: "GET", Host: "h:1", SecFetchSite: "same-origin", Origin: "http://h:1"}, 0},
		{"get typed url", Request{Method: "GET", Host: "h:1", SecFetchSite: "none"}, 0},
		{"get cross-site", Request{Method: "GET", Host: "h:1", SecFetchSite: "cross-site"}, errs.PermissionDenied},
		{"get same-site other port", Request{Method: "GET", Host: "h:1", SecFetchSite: "same-site"}, errs.PermissionDenied},
		{"post with token", Request{Method: "POST", Host: "h:1", Origin: "http://h:1", SecFetchSite: "same-origin", CSRF: tok}, 0},
		{"post https origin", Request{Method: "POST", Host: "h:1", Origin: "https://H:1", CSRF: tok}, 0},
		{"post no token", Request{Method: "POST", Host: "h:1", Origin: "http://h:1", SecFetchSite: "same-origin"}, errs.PermissionDenied},
		{"post wrong token", Request{Method: "POST", Host: "h:1", CSRF: "tok124"}, errs.PermissionDenied},
		{"post short token", Request{Method: "POST", Host: "h:1", CSRF: "tok"}, errs.PermissionDenied},
		{"post cross-site with token", Request{Method: "POST", Host: "h:1", SecFetchSite: "cross-site", CSRF: tok}, errs.PermissionDenied},
		{"post foreign origin with token", Request{Method: "POST", Host: "h:1", Origin: "http://evil:1", CSRF: tok}, errs.PermissionDenied},
		{"post null origin", Request{Method: "POST", Host: "h:1", Origin: "null", CSRF: tok}, errs.PermissionDenied},
		{"post from address bar", Request{Method: "POST", Host: "h:1", SecFetchSite: "none", CSRF: tok}, errs.PermissionDenied},
		{"delete no token", Request{Method: "DELETE", Host: "h:1"}, errs.PermissionDenied},
		{"put with token", Request{Method: "PUT", Host: "h:1", CSRF: tok}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.req, tok)
			if tc.want == 0 && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want != 0 && errs.KindOf(err) != tc.want {
				t.Fatalf("got %v, want kind %v", err, tc.want)
			}
		})
	}
}

func TestSessions(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(keys{"k-alice": {Owner: "alice"}}, Config{TTL: time.Hour, MaxSessions: 2, Now: func() time.Time { return now }})
	if _, _, err := s.SignIn(context.Background(), "wrong"); errs.KindOf(err) != errs.Unauthenticated {
		t.Fatalf("wrong key: %v", err)
	}
	if _, _, err := s.SignIn(context.Background(), ""); errs.FieldOf(err) != "api_key" {
		t.Fatalf("empty key: %v", err)
	}
	id1, se1, err := s.SignIn(context.Background(), "k-alice")
	if err != nil || se1.Owner != "alice" || se1.CSRF == "" || se1.CSRF == id1 {
		t.Fatalf("sign in: %v %+v", err, se1)
	}
	id2, se2, _ := s.SignIn(context.Background(), "k-alice")
	if id1 == id2 || se1.CSRF == se2.CSRF {
		t.Fatal("two sessions share an id or a token")
	}
	now = now.Add(time.Minute)
	id3, _, _ := s.SignIn(context.Background(), "k-alice") // over MaxSessions: the oldest goes
	if _, ok := s.lookup(id1); ok {
		t.Error("oldest session kept past MaxSessions")
	}
	if _, ok := s.lookup(id3); !ok {
		t.Error("new session missing")
	}
	s.SignOut(id3)
	if _, ok := s.lookup(id3); ok {
		t.Error("session kept after sign-out")
	}
	now = now.Add(time.Hour)
	if _, ok := s.lookup(id2); ok {
		t.Error("session kept past its expiry")
	}
	if n := s.Sessions(); n != 0 {
		t.Errorf("%d sessions left", n)
	}
}

// TestHandler drives /ui/session and Authorize over real HTTP requests.
func TestHandler(t *testing.T) {
	s := New(keys{"k-alice": {Owner: "alice"}}, Config{})
	h := s.Handler()
	do := func(method, path, body string, hdr map[string]string, cookie *http.Cookie) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "http://berth.test"+path, strings.NewReader(body))
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		if cookie != nil {
			r.AddCookie(cookie)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := do("GET", "/ui/", "", nil, nil); w.Code != 200 || !strings.Contains(w.Body.String(), "app.js") ||
		!strings.Contains(w.Header().Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("index: %d %q", w.Code, w.Header())
	}
	if w := do("GET", "/ui/views/fleet.js", "", nil, nil); w.Code != 200 || !strings.Contains(w.Header().Get("Content-Type"), "javascript") {
		t.Fatalf("module: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	if w := do("POST", "/ui/session", `{"api_key":"k-alice"}`, map[string]string{"Origin": "http://evil.test"}, nil); w.Code != http.StatusForbidden {
		t.Fatalf("cross-origin sign-in: %d", w.Code)
	}
	if w := do("POST", "/ui/session", `{"api_key":"nope"}`, nil, nil); w.Code != http.StatusUnauthorized {
		t.Fatalf("bad key: %d", w.Code)
	}
	w := do("POST", "/ui/session", `{"api_key":"k-alice"}`, map[string]string{"Origin": "http://berth.test"}, nil)
	if w.Code != 200 {
		t.Fatalf("sign in: %d %s", w.Code, w.Body)
	}
	var se Session
	_ = json.Unmarshal(w.Body.Bytes(), &se)
	if strings.Contains(w.Body.String(), "k-alice") {
		t.Error("the sign-in answer repeats the API key")
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Path != "/" || cookies[0].Secure {
		t.Fatalf("cookie: %+v", cookies)
	}
	c := cookies[0]

	authorize := func(method string, hdr map[string]string, cookie *http.Cookie) (string, error) {
		r := httptest.NewRequest(method, "http://berth.test/v1/sandboxes", nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		if cookie != nil {
			r.AddCookie(cookie)
		}
		return s.Authorize(r)
	}
	if k, err := authorize("GET", nil, nil); k != "" || err != nil {
		t.Fatalf("no cookie: %q %v", k, err)
	}
	if k, err := authorize("GET", nil, c); k != "k-alice" || err != nil {
		t.Fatalf("get: %q %v", k, err)
	}
	if _, err := authorize("POST", nil, c); errs.KindOf(err) != errs.PermissionDenied {
		t.Fatalf("post without csrf: %v", err)
	}
	if k, err := authorize("POST", map[string]string{CSRFHeader: se.CSRF}, c); k != "k-alice" || err != nil {
		t.Fatalf("post with csrf: %q %v", k, err)
	}
	if w := do("GET", "/ui/session", "", nil, c); w.Code != 200 || !strings.Contains(w.Body.String(), se.CSRF) {
		t.Fatalf("current: %d %s", w.Code, w.Body)
	}
	if w := do("DELETE", "/ui/session", "", nil, c); w.Code != http.StatusForbidden {
		t.Fatalf("sign out without csrf: %d", w.Code)
	}
	if w := do("DELETE", "/ui/session", "", map[string]string{CSRFHeader: se.CSRF}, c); w.Code != http.StatusNoContent {
		t.Fatalf("sign out: %d", w.Code)
	}
	if _, err := authorize("GET", nil, c); errs.KindOf(err) != errs.Unauthenticated {
		t.Fatalf("after sign-out: %v", err)
	}
}

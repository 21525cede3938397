package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Request is what the cookie-auth decision needs of an HTTP request.
type Request struct {
	Method       string
	Host         string // the Host the request was sent to
	Origin       string // the Origin header ("" when the browser sent none)
	SecFetchSite string // the Sec-Fetch-Site header ("" from older browsers and non-browsers)
	CSRF         string // the X-Berth-CSRF header
}

func requestOf(r *http.Request) Request {
	return Request{
		Method: r.Method, Host: r.Host, Origin: r.Header.Get("Origin"),
		SecFetchSite: r.Header.Get("Sec-Fetch-Site"), CSRF: r.Header.Get(CSRFHeader),
	}
}

// safeMethod: methods the API never changes state on.
func safeMethod(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// Check decides whether a request carrying a session cookie may act with
// that session, whose CSRF token is csrf. SameSite=Strict already keeps the
// cookie off cross-site requests in current browsers; this is the second
// lock, for browsers that do not honour it and for same-site-but-other-
// origin pages (another port on the same host): a write needs the
// per-session token in a header, which a cross-origin page can neither read
// nor set without a CORS grant berth never gives.
func Check(req Request, csrf string) error {
	if err := CheckOrigin(req); err != nil {
		return err
	}
	if safeMethod(req.Method) {
		return nil
	}
	if req.CSRF == "" {
		return errs.E(errs.PermissionDenied, "console: the %s header is required with the session cookie", CSRFHeader)
	}
	if !tokensEqual(req.CSRF, csrf) {
		return errs.E(errs.PermissionDenied, "console: the %s header does not match the session", CSRFHeader)
	}
	return nil
}

// CheckOrigin refuses a request that a browser says comes from another
// origin. Sign-in (which has no session yet) checks only this, so a
// foreign page cannot sign a visitor in with the attacker's key.
func CheckOrigin(req Request) error {
	switch req.SecFetchSite {
	case "", "same-origin":
	case "none": // typed into the address bar, a bookmark: a navigation, reads only
		if !safeMethod(req.Method) {
			return errs.E(errs.PermissionDenied, "console: a write must come from the console's own page")
		}
	default: // same-site, cross-site
		return errs.E(errs.PermissionDenied, "console: cross-origin request refused (Sec-Fetch-Site: %s)", req.SecFetchSite)
	}
	if req.Origin != "" && !sameOrigin(req.Origin, req.Host) {
		return errs.E(errs.PermissionDenied, "console: cross-origin request refused (Origin %q is not this server)", req.Origin)
	}
	return nil
}

// sameOrigin reports whether an Origin header names host (scheme either:
// a TLS-terminating proxy in front of berth changes it).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false // includes "null" (sandboxed frames, file: pages)
	}
	return strings.EqualFold(u.Host, host)
}

// Authorize is the REST API's cookie authentication: for a request with no
// API key, it returns the key of the request's session, or "" when the
// request carries no session cookie. A cookie that names no live session,
// or a request that fails Check, is refused.
func (s *Service) Authorize(r *http.Request) (string, error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return "", nil
	}
	se, ok := s.lookup(c.Value)
	if !ok {
		return "", errs.E(errs.Unauthenticated, "console: session expired or signed out; sign in again")
	}
	if err := Check(requestOf(r), se.csrf); err != nil {
		return "", err
	}
	return se.key, nil
}

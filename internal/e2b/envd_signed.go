package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Signed file URLs (envd's /files with ?signature=): the SDK's
// sbx.uploadUrl(path) / downloadUrl(path) for secure sandboxes (every berth
// sandbox has an envdAccessToken, so the SDK always signs) carry
//
//	signature = "v1_" + base64(sha256("<path>:<read|write>:<username>:<envdAccessToken>[:<expiration>]")), '=' stripped
//	signature_expiration = unix seconds (optional; part of what is signed)
//
// and no X-Access-Token: the URL is handed to a browser or another program.
// berth recomputes the signature with the sandbox's own token, compares in
// constant time, and refuses an expired one, before anything reaches the
// agent. The operation follows the method (GET read, POST write), so a
// download URL cannot upload. Through E2B_SANDBOX_URL the URL names no
// sandbox (the SDK builds it from the base URL alone): the signature then
// identifies it, by trying the token of each live sandbox.

const (
	querySignature  = "signature"
	queryExpiration = "signature_expiration"
)

// isSignedFiles reports whether r is a signed /files request.
func isSignedFiles(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Get(querySignature) != ""
}

// fileSignature is the SDK's getSignature (src/sandbox/signature.ts);
// exp 0 means no expiration.
func fileSignature(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// signedParams are the parts of a signed request that are checked.
type signedParams struct {
	path, op, user, sig string
	exp                 int64
}

func parseSigned(method string, q url.Values) (signedParams, error) {
	p := signedParams{path: q.Get("path"), user: q.Get("username"), sig: q.Get(querySignature), op: "read"}
	if method == http.MethodPost {
		p.op = "write"
	}
	if s := q.Get(queryExpiration); s != "" {
		exp, err := strconv.ParseInt(s, 10, 64)
		if err != nil || exp <= 0 {
			return p, errs.Field(queryExpiration, "must be unix seconds, got %q", s)
		}
		p.exp = exp
	}
	return p, nil
}

// matches reports whether p is signed with token (expiry not checked).
func (p signedParams) matches(token string) bool {
	want := fileSignature(p.path, p.op, p.user, token, p.exp)
	return subtle.ConstantTimeCompare([]byte(want), []byte(p.sig)) == 1
}

// expired reports whether p's expiration (if any) has passed at now.
func (p signedParams) expired(now time.Time) bool {
	return p.exp != 0 && now.Unix() > p.exp
}

// errBadSignature is the one answer for a signature that matches no
// sandbox (tampered, for another sandbox, or for another operation).
var errBadSignature = errs.E(errs.Unauthenticated, "invalid signature for this file URL")

// signedTarget resolves and authorises the sandbox of a signed /files
// request: id when the request names one (Host or E2b-Sandbox-Id), else the
// live sandbox whose token made the signature. A signature that fits no
// sandbox, or has expired, is Unauthenticated; nothing is served then.
func (s *Server) signedTarget(ctx context.Context, r *http.Request, id string) (*sandbox.Sandbox, error) {
	p, err := parseSigned(r.Method, r.URL.Query())
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(p.sig, "v1_") || len(p.sig) > 64 {
		return nil, errBadSignature
	}
	check := func(sb *sandbox.Sandbox) (bool, error) {
		tok, err := s.d.Auth().EnvdToken(ctx, sb)
		if err != nil {
			return false, err
		}
		return p.matches(tok), nil
	}
	var found *sandbox.Sandbox
	if id != "" {
		sb, err := s.d.Get(ctx, "", id)
		if err != nil {
			return nil, err
		}
		ok, err := check(sb)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errBadSignature
		}
		found = sb
	} else {
		f := daemon.ListFilter{States: []sandbox.State{sandbox.Running, sandbox.Paused, sandbox.Resuming, sandbox.Pausing}, Limit: 500}
		for found == nil {
			sbs, next, err := s.d.List(ctx, f)
			if err != nil {
				return nil, err
			}
			for _, sb := range sbs {
				ok, err := check(sb)
				if err != nil {
					return nil, err
				}
				if ok {
					found = sb
					break
				}
			}
			if next == "" {
				break
			}
			f.Cursor = next
		}
		if found == nil {
			return nil, errBadSignature
		}
	}
	if p.expired(s.opts.Now()) {
		return nil, errs.E(errs.Unauthenticated, "signature expired at %s", time.Unix(p.exp, 0).UTC().Format(time.RFC3339))
	}
	return found, nil
}

package api

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
	"github.com/berth-dev/berth/internal/sandbox"
)

// ReasonNodeLost is a lost sandbox's reason.
const ReasonNodeLost = "node_lost"

// credentials are the tenant's own: a request the replica signs reaches
// the node with the principal instead, so a node never sees an API key
// (nor a console cookie).
var credentials = []string{"X-Api-Key", "Authorization", "Cookie"}

// hopHeaders are connection-level headers a forwarded copy must not carry.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// send forwards a copy of in with body to node and reads the answer
// (bounded): creates, whose answer the replica looks at. p signs it (nil:
// unsigned); id, when set, is the sandbox id the node must use.
func (r *Replica) send(ctx context.Context, node string, in *http.Request, body []byte, p *peer.Principal, id string) (*nodeAnswer, error) {
	return r.sendLimit(ctx, node, in, body, p, id, maxAnswer)
}

// sendLimit is send reading at most limit bytes of the answer (a fan-out
// shares its budget among the nodes it asks).
func (r *Replica) sendLimit(ctx context.Context, node string, in *http.Request, body []byte, p *peer.Principal, id string, limit int64) (*nodeAnswer, error) {
	base, tr, err := r.nodes.endpoint(ctx, node)
	if err != nil {
		return nil, err
	}
	u := *base
	u.Path, u.RawPath, u.RawQuery = in.URL.Path, in.URL.RawPath, in.URL.RawQuery
	out, err := http.NewRequestWithContext(ctx, in.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "forward to node %s", node)
	}
	out.Header = in.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	// The replica reads this answer (and sends on only its body and
	// type): it must come uncompressed, whatever the client accepts.
	out.Header.Del("Accept-Encoding")
	peer.Strip(out.Header)
	if p != nil {
		for _, h := range credentials {
			out.Header.Del(h)
		}
		peer.Sign(out, r.cfg.Token, *p)
	}
	if id != "" {
		out.Header.Set(peer.HeaderSandboxID, id)
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(out)
	r.metrics.forwarded(node, time.Since(start), err)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "node %s did not answer", node)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "node %s: read answer", node)
	}
	if int64(len(b)) > limit {
		return nil, errs.E(errs.Unavailable, "node %s: answer over %d bytes", node, limit)
	}
	if p != nil && resp.StatusCode == http.StatusUnauthorized {
		return nil, tokenRefused(node, b)
	}
	return &nodeAnswer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// tokenRefused: a node refusing a signed request refuses the replica (its
// cluster token), not the client, whose key the replica checked.
func tokenRefused(node string, body []byte) error {
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return errs.E(errs.Unavailable, "node %s refused this replica's cluster token (is its %s Secret another namespace's?): %s", node, peer.SecretName, msg)
}

// errStyle is how an error is written: berth's REST form or E2B's.
type errStyle int

const (
	styleREST errStyle = iota
	styleE2B
)

func (s errStyle) write(w http.ResponseWriter, err error) {
	if s == styleE2B {
		writeE2BError(w, err)
		return
	}
	writeError(w, err)
}

// lostError is what a request for a lost sandbox gets: 410 Gone, kind
// failed_precondition, the reason node_lost in the message.
func lostError(sb *sandbox.Sandbox) error {
	return errs.E(errs.FailedPrecondition, "sandbox %s is lost (%s): its node %s stopped renewing its lease; only delete is possible",
		sb.ID, ReasonNodeLost, sb.Attrs.Cluster.Node)
}

func writeLost(w http.ResponseWriter, style errStyle, sb *sandbox.Sandbox) {
	err := lostError(sb)
	if style == styleE2B {
		httpx.WriteJSON(w, http.StatusGone, map[string]any{"code": http.StatusGone, "message": err.Error()})
		return
	}
	httpx.WriteJSONIndent(w, http.StatusGone, wire.Error{Code: http.StatusGone, Message: err.Error(), Reason: errs.FailedPrecondition.String()})
}

// proxy streams req to the node running sb and its answer back: exec
// output, PTYs, file transfers and WebSocket upgrades pass as they come
// (FlushInterval -1; httputil.ReverseProxy handles the upgrade). p signs
// it (nil: the node authenticates the request itself, e.g. envd's access
// token). after, when set, sees the node's answer before the client does.
func (r *Replica) proxy(w http.ResponseWriter, req *http.Request, sb *sandbox.Sandbox, p *peer.Principal, style errStyle, after func(*http.Response) error) {
	if sb.State == sandbox.Lost {
		writeLost(w, style, sb)
		return
	}
	node := sb.Attrs.Cluster.Node
	if node == "" {
		style.write(w, errs.E(errs.FailedPrecondition, "sandbox %s is not bound to a node yet", sb.ID))
		return
	}
	r.proxyNode(w, req, node, "running sandbox "+sb.ID, p, style, after)
}

// proxyNode is proxy to a named node; about says in errors and logs what
// the node was chosen for.
func (r *Replica) proxyNode(w http.ResponseWriter, req *http.Request, node, about string, p *peer.Principal, style errStyle, after func(*http.Response) error) {
	base, tr, err := r.nodes.endpoint(req.Context(), node)
	if err != nil {
		style.write(w, err)
		return
	}
	start, answered := time.Now(), false
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			// The Host stays the client's: a host-routed envd request
			// ("49983-<id>.<domain>") is routed by it on the node too.
			pr.Out.Host = pr.In.Host
			peer.Strip(pr.Out.Header)
			if p != nil {
				for _, h := range credentials {
					pr.Out.Header.Del(h)
				}
				peer.Sign(pr.Out, r.cfg.Token, *p)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			answered = true
			r.metrics.forwarded(node, time.Since(start), nil)
			if p != nil && resp.StatusCode == http.StatusUnauthorized {
				b, _ := readResponse(resp)
				return tokenRefused(node, b) // to ErrorHandler: 503 naming the node
			}
			if after != nil {
				return after(resp)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if req.Context().Err() != nil {
				return // the client left
			}
			if !answered {
				r.metrics.forwarded(node, 0, err)
			}
			r.log.Warn("node did not answer", "node", node, "about", about, "path", req.URL.Path, "err", err)
			if errs.KindOf(err) == errs.Unavailable {
				style.write(w, err)
				return
			}
			style.write(w, errs.Wrap(errs.Unavailable, err, "node %s (%s) did not answer", node, about))
		},
	}
	// Full duplex: the node may answer before the transport has sent all
	// of the client's body (an exec answers once it has decoded the
	// command; `exec -i` streams stdin while output streams back). Without
	// it net/http's HTTP/1 server closes the request body when the answer's
	// header goes out, the transport's write of the body fails and it drops
	// the connection to the node mid-answer (seen: exec streams cut under load).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, req)
}

// readResponse replaces resp's body with a bounded in-memory copy and
// returns it (for answers the replica records: fork, delete).
func readResponse(resp *http.Response) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if len(b) > maxAnswer {
		return nil, errs.E(errs.Unavailable, "node answer over %d bytes", maxAnswer)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return b, nil
}

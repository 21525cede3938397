package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

// NetworkRequest is the body of PUT /v1/sandboxes/{id}/net.
type NetworkRequest = wire.NetworkRequest

func (s netAPI) getNetwork(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	info, err := s.d.Net().Info(r.Context(), owner(r, p), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, networkView(info))
	return nil
}

func (s netAPI) setNetwork(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req NetworkRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	pol, err := s.d.Net().BuildPolicy(req.Mode, req.Allow, req.Deny)
	if err != nil {
		return err
	}
	if pol.Effects, err = effectPolicy(req.Effects); err != nil {
		return err
	}
	info, err := s.d.Net().SetPolicy(r.Context(), owner(r, p), r.PathValue("id"), p.Owner, pol)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, networkView(info))
	return nil
}

// EgressEntry is one egress log entry in the API.
type EgressEntry = wire.EgressEntry

// EgressLogResponse is the body of GET /v1/sandboxes/{id}/net/log.
type EgressLogResponse = wire.EgressLogResponse

func (s netAPI) egressLog(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	q := r.URL.Query()
	var after int64
	limit := 1000
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errs.Field("after", "must be a non-negative integer")
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errs.Field("limit", "must be a non-negative integer")
		}
		limit = n
	}
	list, err := s.d.Net().EgressLog(r.Context(), owner(r, p), r.PathValue("id"), after, limit)
	if err != nil {
		return err
	}
	out := EgressLogResponse{Entries: make([]EgressEntry, 0, len(list)), Next: after}
	for _, e := range list {
		out.Entries = append(out.Entries, EgressEntry{Seq: e.Seq, Time: e.Time, Proto: e.Proto, DstIP: e.DstIP,
			DstPort: e.DstPort, Host: e.Host, Verdict: e.Verdict, Rule: e.Rule, Reason: e.Reason,
			Intercepted: e.Intercepted, BytesOut: e.BytesOut, BytesIn: e.BytesIn, DurationMS: e.Duration.Milliseconds()})
		out.Next = e.Seq
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// PortRequest is the body of POST /v1/sandboxes/{id}/ports.
type PortRequest = wire.PortRequest

// PortResponse says where an exposed port is reachable.
type PortResponse = wire.PortResponse

func portURL(r *http.Request, id string, port int) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + "/"
}

func (s netAPI) exposePort(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	var req PortRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	info, tok, err := s.d.Net().ExposePort(r.Context(), owner(r, p), id, req.Port, req.Token)
	if err != nil {
		return err
	}
	resp := PortResponse{PortInfo: wire.PortInfo(info), URL: portURL(r, id, info.Port), AccessToken: tok}
	if tok != "" {
		resp.URL += "?token=" + url.QueryEscape(tok)
	}
	writeJSON(w, http.StatusCreated, resp)
	return nil
}

func (s netAPI) listPorts(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	id := r.PathValue("id")
	list, err := s.d.Net().Ports(r.Context(), owner(r, p), id)
	if err != nil {
		return err
	}
	out := make([]PortResponse, 0, len(list))
	for _, pi := range list {
		out = append(out, PortResponse{PortInfo: wire.PortInfo(pi), URL: portURL(r, id, pi.Port)})
	}
	writeJSON(w, http.StatusOK, wire.PortList{Ports: out})
	return nil
}

func (s netAPI) closePort(w http.ResponseWriter, r *http.Request, p daemon.Principal) error {
	n, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return errs.Field("port", "must be 1-65535")
	}
	if err := s.d.Net().ClosePort(r.Context(), owner(r, p), r.PathValue("id"), n); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// portTokenHeader carries a port token as an alternative to ?token=.
const portTokenHeader = "X-Berth-Port-Token"

// portProxy relays any request under /v1/sandboxes/{id}/ports/{port}/ to
// that port of the sandbox. It authenticates itself (owner's key or the
// port's token) and strips berth's credentials before relaying.
func (s netAPI) portProxy(w http.ResponseWriter, r *http.Request) {
	id, port := r.PathValue("id"), r.PathValue("port")
	token := r.URL.Query().Get("token")
	if token == "" {
		token = r.Header.Get(portTokenHeader)
	}
	key := auth.KeyFromRequest(r)
	// A replica's signed request is authorized as its principal (cluster mode).
	cp, cluster, err := s.d.Auth().ClusterPrincipal(r)
	if err == nil && cluster {
		err = s.d.Net().AuthorizePortAs(r.Context(), cp, id, port)
	} else if err == nil {
		err = s.d.Net().AuthorizePort(r.Context(), key, token, id, port)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	prefix := "/v1/sandboxes/" + id + "/ports/" + port
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme, out.URL.Host = "http", "sandbox:"+port
			out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
			out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, prefix)
			q := out.URL.Query()
			q.Del("token")
			out.URL.RawQuery = q.Encode()
			out.Host = pr.In.Host
			out.Header.Del("X-API-Key")
			out.Header.Del(portTokenHeader)
			peer.Strip(out.Header) // the cluster token never reaches a sandbox
			if key != "" && strings.HasPrefix(out.Header.Get("Authorization"), "Bearer "+key) {
				out.Header.Del("Authorization")
			}
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.d.Net().DialPort(ctx, id, port)
			},
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 5 * time.Minute,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errs.KindOf(err) == errs.Internal {
				err = errs.Wrap(errs.Unavailable, err, "sandbox %s port %s", id, port)
			}
			writeError(w, err)
		},
	}
	rp.ServeHTTP(w, r)
}

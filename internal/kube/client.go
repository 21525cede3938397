// Package kube is berth's client of the Kubernetes API: plain REST over
// net/http with JSON bodies, no client-go. Cluster mode needs a dozen verbs
// on a handful of kinds (berth.dev CRDs, Leases, Secrets, Namespaces); this
// keeps the berth binary small and its build fast (client-go and its
// generated clients would add ~40 MB of dependencies and minutes of CI).
//
// Errors carry internal/errs kinds: NotFound (404), AlreadyExists (409
// AlreadyExists), Conflict (409 Conflict: a stale resourceVersion),
// InvalidArgument (422 / 400, naming the field the server names),
// Unauthenticated (401), PermissionDenied (403), Unavailable (5xx, 429,
// transport errors).
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Resource names a kind's REST collection.
type Resource struct {
	Group, Version, Plural string
	Namespaced             bool
}

// The resources berth uses.
var (
	Namespaces = Resource{Version: "v1", Plural: "namespaces"}
	Secrets    = Resource{Version: "v1", Plural: "secrets", Namespaced: true}
	Leases     = Resource{Group: "coordination.k8s.io", Version: "v1", Plural: "leases", Namespaced: true}
	CRDs       = Resource{Group: "apiextensions.k8s.io", Version: "v1", Plural: "customresourcedefinitions"}
)

// Path is the collection's URL path in namespace ns ("" for a cluster
// scoped kind, or for every namespace of a namespaced one).
func (r Resource) Path(ns string) string {
	p := "/api/" + r.Version
	if r.Group != "" {
		p = "/apis/" + r.Group + "/" + r.Version
	}
	if r.Namespaced && ns != "" {
		p += "/namespaces/" + url.PathEscape(ns)
	}
	return p + "/" + r.Plural
}

// APIVersion is the resource's apiVersion field value.
func (r Resource) APIVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// Client talks to one API server. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	hc   *http.Client
	// watch streams get their own client: no overall timeout.
	stream *http.Client
}

// New builds a client for cfg.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, errs.Field("server", "must be an http(s) URL, got %q", cfg.Server)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.Insecure} //nolint:gosec // only when the kubeconfig says so
	if len(cfg.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAData) {
			return nil, errs.Field("certificate-authority-data", "no PEM certificate in it")
		}
		tc.RootCAs = pool
	}
	if len(cfg.CertData) > 0 {
		cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, err, "client-certificate-data")
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{
		Proxy:               nil, // the API server is reached directly, never through HTTPS_PROXY
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return &Client{cfg: cfg, base: u, hc: &http.Client{Transport: tr, Timeout: timeout}, stream: &http.Client{Transport: tr}}, nil
}

// Config returns the configuration the client was built from.
func (c *Client) Config() Config { return c.cfg }

// Namespace is the configured default namespace ("default" when unset).
func (c *Client) Namespace() string {
	if c.cfg.Namespace == "" {
		return "default"
	}
	return c.cfg.Namespace
}

// ListOptions narrow a list or watch.
type ListOptions struct {
	LabelSelector   string
	FieldSelector   string
	Limit           int64
	Continue        string
	ResourceVersion string
	// TimeoutSeconds bounds a watch on the server side.
	TimeoutSeconds int64
}

func (o ListOptions) query(watch bool) url.Values {
	q := url.Values{}
	if o.LabelSelector != "" {
		q.Set("labelSelector", o.LabelSelector)
	}
	if o.FieldSelector != "" {
		q.Set("fieldSelector", o.FieldSelector)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.FormatInt(o.Limit, 10))
	}
	if o.Continue != "" {
		q.Set("continue", o.Continue)
	}
	if o.ResourceVersion != "" {
		q.Set("resourceVersion", o.ResourceVersion)
	}
	if o.TimeoutSeconds > 0 {
		q.Set("timeoutSeconds", strconv.FormatInt(o.TimeoutSeconds, 10))
	}
	if watch {
		q.Set("watch", "true")
		q.Set("allowWatchBookmarks", "true")
	}
	return q
}

func objPath(r Resource, ns, name string, sub ...string) string {
	p := r.Path(ns) + "/" + url.PathEscape(name)
	for _, s := range sub {
		p += "/" + s
	}
	return p
}

// Get reads one object into out.
func (c *Client) Get(ctx context.Context, r Resource, ns, name string, out any) error {
	return c.Do(ctx, http.MethodGet, objPath(r, ns, name), nil, nil, out)
}

// List reads a collection (a *XList with Items) into out.
func (c *Client) List(ctx context.Context, r Resource, ns string, opts ListOptions, out any) error {
	return c.Do(ctx, http.MethodGet, r.Path(ns), opts.query(false), nil, out)
}

// Create posts obj to the collection; the stored object lands in out (may be nil).
func (c *Client) Create(ctx context.Context, r Resource, ns string, obj, out any) error {
	return c.Do(ctx, http.MethodPost, r.Path(ns), nil, obj, out)
}

// Update replaces the object named name. A resourceVersion in obj's
// metadata makes it conditional: a stale one is a Conflict error.
func (c *Client) Update(ctx context.Context, r Resource, ns, name string, obj, out any) error {
	return c.Do(ctx, http.MethodPut, objPath(r, ns, name), nil, obj, out)
}

// UpdateStatus replaces the status subresource (same concurrency rule).
func (c *Client) UpdateStatus(ctx context.Context, r Resource, ns, name string, obj, out any) error {
	return c.Do(ctx, http.MethodPut, objPath(r, ns, name, "status"), nil, obj, out)
}

// Patch types.
const (
	MergePatch     = "application/merge-patch+json"
	JSONPatch      = "application/json-patch+json"
	StrategicPatch = "application/strategic-merge-patch+json"
	ApplyPatch     = "application/apply-patch+yaml"
)

// Patch applies patch of type pt to the object (subresource "" or "status").
func (c *Client) Patch(ctx context.Context, r Resource, ns, name, pt string, patch []byte, subresource string, out any) error {
	p := objPath(r, ns, name)
	if subresource != "" {
		p += "/" + subresource
	}
	return c.do(ctx, http.MethodPatch, p, nil, pt, patch, out)
}

// Apply is a server-side apply of obj (JSON is YAML) as fieldManager.
func (c *Client) Apply(ctx context.Context, r Resource, ns, name, fieldManager string, force bool, obj, out any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "apply %s", name)
	}
	q := url.Values{"fieldManager": {fieldManager}}
	if force {
		q.Set("force", "true")
	}
	return c.do(ctx, http.MethodPatch, objPath(r, ns, name), q, ApplyPatch, b, out)
}

// DeleteOptions make a delete conditional.
type DeleteOptions struct {
	// Preconditions: the delete fails with Conflict unless they hold.
	ResourceVersion string
	UID             string
	// PropagationPolicy: "Background" (default), "Foreground", "Orphan".
	PropagationPolicy string
}

// Delete removes the object. A missing object is NotFound.
func (c *Client) Delete(ctx context.Context, r Resource, ns, name string, opts DeleteOptions) error {
	body := map[string]any{"apiVersion": "v1", "kind": "DeleteOptions"}
	pre := map[string]string{}
	if opts.ResourceVersion != "" {
		pre["resourceVersion"] = opts.ResourceVersion
	}
	if opts.UID != "" {
		pre["uid"] = opts.UID
	}
	if len(pre) > 0 {
		body["preconditions"] = pre
	}
	if opts.PropagationPolicy != "" {
		body["propagationPolicy"] = opts.PropagationPolicy
	}
	return c.Do(ctx, http.MethodDelete, objPath(r, ns, name), nil, body, nil)
}

// DeleteCollection removes every object of the collection matching opts.
func (c *Client) DeleteCollection(ctx context.Context, r Resource, ns string, opts ListOptions) error {
	return c.Do(ctx, http.MethodDelete, r.Path(ns), opts.query(false), nil, nil)
}

// Do sends a JSON request (body marshalled unless nil or []byte) and
// decodes a 2xx answer into out (when non-nil).
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	default:
		j, err := json.Marshal(body)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "encode %s %s", method, path)
		}
		raw = j
	}
	return c.do(ctx, method, path, q, "application/json", raw, out)
}

// maxBody bounds an answer read into memory (a list of many objects).
const maxBody = 64 << 20

func (c *Client) request(ctx context.Context, method, path string, q url.Values, ctype string, body io.Reader) (*http.Request, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "%s %s", method, path)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	req.Header.Set("User-Agent", "berth")
	return req, nil
}

// Throttled answers are retried: the API server answers 429 with
// Retry-After while it is over its in-flight limits and while a resource's
// storage is (re)initializing (seconds after a CRD is installed, or after
// etcd came back). client-go retries those too; a caller would only retry
// the same way, so the client does it once for all.
const (
	maxRetries    = 5               // 429s retried before the last one is returned
	maxRetryAfter = 2 * time.Second // longest wait honoured per retry
)

// retryAfter is how long a throttled answer asks to wait (1 s when it
// does not say; capped at maxRetryAfter).
func retryAfter(h http.Header) time.Duration {
	d := time.Second
	if n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After"))); err == nil && n >= 0 {
		d = time.Duration(n) * time.Second
	}
	return min(max(d, 100*time.Millisecond), maxRetryAfter)
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, ctype string, body []byte, out any) error {
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := c.request(ctx, method, path, q, ctype, rd)
		if err != nil {
			return err
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return errs.Wrap(errs.Unavailable, ctx.Err(), "kubernetes %s %s", method, path)
			}
			return errs.Wrap(errs.Unavailable, err, "kubernetes %s %s", method, path)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
		resp.Body.Close()
		if err != nil {
			return errs.Wrap(errs.Unavailable, err, "kubernetes %s %s: read answer", method, path)
		}
		if len(b) > maxBody {
			return errs.E(errs.ResourceExhausted, "kubernetes %s %s: answer over %d bytes", method, path, maxBody)
		}
		if resp.StatusCode == http.StatusTooManyRequests && attempt < maxRetries {
			t := time.NewTimer(retryAfter(resp.Header))
			select {
			case <-ctx.Done():
				t.Stop()
				return statusError(method, path, resp.StatusCode, b)
			case <-t.C:
			}
			continue
		}
		if resp.StatusCode/100 != 2 {
			return statusError(method, path, resp.StatusCode, b)
		}
		if out == nil || len(b) == 0 {
			return nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return errs.Wrap(errs.Internal, err, "kubernetes %s %s: decode answer", method, path)
		}
		return nil
	}
}

// Status is the API server's error body.
type Status struct {
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
	Details *struct {
		Name   string `json:"name"`
		Kind   string `json:"kind"`
		Causes []struct {
			Type    string `json:"reason"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"causes"`
	} `json:"details"`
}

func statusError(method, path string, code int, body []byte) error {
	var st Status
	_ = json.Unmarshal(body, &st)
	msg := st.Message
	if msg == "" {
		msg = strings.TrimSpace(string(body))
		if len(msg) > 300 {
			msg = msg[:300]
		}
	}
	where := fmt.Sprintf("kubernetes %s %s", method, path)
	switch {
	case code == http.StatusNotFound:
		return errs.E(errs.NotFound, "%s: %s", where, msg)
	case code == http.StatusConflict && st.Reason == "AlreadyExists":
		return errs.E(errs.AlreadyExists, "%s: %s", where, msg)
	case code == http.StatusConflict:
		return errs.E(errs.Conflict, "%s: %s", where, msg)
	case code == http.StatusUnprocessableEntity || code == http.StatusBadRequest:
		if st.Details != nil && len(st.Details.Causes) > 0 && st.Details.Causes[0].Field != "" {
			return errs.Field(st.Details.Causes[0].Field, "%s: %s", where, msg)
		}
		return errs.E(errs.InvalidArgument, "%s: %s", where, msg)
	case code == http.StatusUnauthorized:
		return errs.E(errs.Unauthenticated, "%s: %s", where, msg)
	case code == http.StatusForbidden:
		return errs.E(errs.PermissionDenied, "%s: %s", where, msg)
	case code == http.StatusPreconditionFailed:
		return errs.E(errs.Conflict, "%s: %s", where, msg)
	case code == http.StatusGone:
		return &GoneError{errs.E(errs.Conflict, "%s: %s", where, msg)}
	default:
		return errs.E(errs.Unavailable, "%s: %d %s", where, code, msg)
	}
}

// GoneError is a 410: the resourceVersion a list or watch asked for is
// compacted away; list again.
type GoneError struct{ error }

func (g *GoneError) Unwrap() error { return g.error }

// Package client is the Go SDK for berth: a typed client of the /v1 REST API
// (the same surface the `berth` CLI and `berth bench` use). Bodies are the
// types of github.com/berth-dev/berth/api/wire.
//
// A Client holds the server's address and an API key. Operations on one
// sandbox hang off a Sandbox handle; exec answers a Process whose stream of
// events ends in the command's exit status:
//
//	c := client.New("http://127.0.0.1:7070", os.Getenv("BERTH_API_KEY"))
//	sb, err := c.Create(ctx, wire.CreateRequest{Template: "default", TTL: "30m"})
//	if err != nil {
//		return err
//	}
//	defer c.Sandbox(sb.ID).Delete(context.WithoutCancel(ctx))
//	code, err := c.Sandbox(sb.ID).Run(ctx, wire.ExecRequest{Cmd: []string{"echo", "hi"}}, os.Stdout, os.Stderr)
//
// Every non-2xx answer is an *Error carrying the server's status, error kind
// (Reason: "not_found", "invalid_argument", ...) and the offending field; a
// server that cannot be reached is an *Error of kind "unavailable" with
// status 0. Streams (exec, attach, template pulls and builds) are read
// line by line and are never buffered whole.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/api/wire"
)

// DefaultURL is where a local `berth serve` listens.
const DefaultURL = "http://127.0.0.1:7070"

// Error kinds (wire.Error.Reason) a caller may want to test for.
const (
	KindNotFound           = "not_found"
	KindAlreadyExists      = "already_exists"
	KindInvalidArgument    = "invalid_argument"
	KindFailedPrecondition = "failed_precondition"
	KindConflict           = "conflict"
	KindResourceExhausted  = "resource_exhausted"
	KindPermissionDenied   = "permission_denied"
	KindUnauthenticated    = "unauthenticated"
	KindUnavailable        = "unavailable"
	KindNotImplemented     = "not_implemented"
	KindInternal           = "internal"
)

// Error is a failed API call: the server's answer, or (StatusCode 0) no
// answer at all.
type Error struct {
	StatusCode int    // HTTP status; 0 if the server was not reached
	Kind       string // the server's reason, e.g. "not_found"
	Field      string // the offending input, if any
	Message    string
	Err        error // the transport error when StatusCode is 0
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf is err's kind if it is (or wraps) an *Error, else "".
func KindOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// IsNotFound reports whether err is the server's not_found.
func IsNotFound(err error) bool { return KindOf(err) == KindNotFound }

// Client talks to one berth server. It is safe for concurrent use.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient uses hc for every request (the default is a client of its
// own with keep-alive connections).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a client of the server at baseURL (e.g. DefaultURL) acting
// with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: apiKey, hc: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv is the CLI's configuration: BERTH_URL (default DefaultURL) and
// BERTH_API_KEY, or else the admin key a local server keeps in
// $BERTH_DATA_DIR/admin.key (default /var/lib/berth).
func FromEnv(opts ...Option) (*Client, error) {
	base := os.Getenv("BERTH_URL")
	if base == "" {
		base = DefaultURL
	}
	key := os.Getenv("BERTH_API_KEY")
	if key == "" {
		dir := os.Getenv("BERTH_DATA_DIR")
		if dir == "" {
			dir = "/var/lib/berth"
		}
		b, err := os.ReadFile(filepath.Join(dir, "admin.key"))
		if err != nil {
			return nil, &Error{Kind: KindUnauthenticated, Message: fmt.Sprintf("no API key: set BERTH_API_KEY (or run as root next to a local server, which reads %s/admin.key)", dir)}
		}
		key = strings.TrimSpace(string(b))
	}
	return New(base, key, opts...), nil
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.base }

// APIKey is the key the client acts with (e.g. to hand to a subprocess).
func (c *Client) APIKey() string { return c.key }

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 1 << 20

// Do sends one request to path (e.g. "/v1/info") and returns the response of
// a 2xx answer, whose body the caller must close; any other answer is an
// *Error. It is the escape hatch for what has no method.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &Error{Kind: KindUnavailable, Message: fmt.Sprintf("cannot reach berth at %s (is `berth serve` running?)", c.base), Err: err}
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		var we wire.Error
		if json.Unmarshal(b, &we) != nil || we.Message == "" {
			return nil, &Error{StatusCode: resp.StatusCode, Kind: KindInternal,
				Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))}
		}
		kind := we.Reason
		if kind == "" {
			kind = KindInternal
		}
		return nil, &Error{StatusCode: resp.StatusCode, Kind: kind, Field: we.Field, Message: we.Message}
	}
	return resp, nil
}

// Call sends in as JSON (nil: no body) and decodes a JSON answer into out
// (nil: discard it).
func (c *Client) Call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.Do(ctx, method, path, q, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

func get[T any](ctx context.Context, c *Client, path string, q url.Values) (T, error) {
	var v T
	err := c.Call(ctx, http.MethodGet, path, q, nil, &v)
	return v, err
}

func send[T any](ctx context.Context, c *Client, method, path string, in any) (T, error) {
	var v T
	err := c.Call(ctx, method, path, nil, in, &v)
	return v, err
}

func seg(s string) string { return url.PathEscape(s) }

// Health checks that the server answers (no key needed).
func (c *Client) Health(ctx context.Context) error {
	_, err := get[wire.Health](ctx, c, "/v1/health", nil)
	return err
}

// Info is GET /v1/info: the server's version, runtimes and who the key is.
func (c *Client) Info(ctx context.Context) (wire.Info, error) {
	return get[wire.Info](ctx, c, "/v1/info", nil)
}

// Create creates a sandbox; the server answers once its agent is ready.
func (c *Client) Create(ctx context.Context, req wire.CreateRequest) (*wire.Sandbox, error) {
	sb, err := send[wire.Sandbox](ctx, c, http.MethodPost, "/v1/sandboxes", req)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filter GET /v1/sandboxes.
type ListOptions struct {
	States   []wire.State
	Labels   map[string]string
	Owner    string // admin key only: another owner's sandboxes
	Template string
	Limit    int    // page size; 0 = the server's default
	Cursor   string // from a previous page's Next
}

func (o ListOptions) query() url.Values {
	q := url.Values{}
	for _, s := range o.States {
		q.Add("state", string(s))
	}
	for k, v := range o.Labels {
		q.Add("label", k+"="+v)
	}
	for k, v := range map[string]string{"owner": o.Owner, "template": o.Template, "cursor": o.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	return q
}

// List answers one page of sandboxes.
func (c *Client) List(ctx context.Context, o ListOptions) (wire.ListResponse, error) {
	return get[wire.ListResponse](ctx, c, "/v1/sandboxes", o.query())
}

// ListAll follows the pages from o.Cursor to the end.
func (c *Client) ListAll(ctx context.Context, o ListOptions) ([]wire.Sandbox, error) {
	all := []wire.Sandbox{}
	for {
		page, err := c.List(ctx, o)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Sandboxes...)
		if page.Next == "" {
			return all, nil
		}
		o.Cursor = page.Next
	}
}

// EventsOptions filter GET /v1/events.
type EventsOptions struct {
	SandboxID string
	Owner     string // admin key only
	After     int64  // sequence number
	Limit     int
}

// Events lists lifecycle events, oldest first.
func (c *Client) Events(ctx context.Context, o EventsOptions) ([]wire.Event, error) {
	q := url.Values{}
	if o.SandboxID != "" {
		q.Set("sandbox", o.SandboxID)
	}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	if o.After > 0 {
		q.Set("after", fmt.Sprint(o.After))
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	return get[[]wire.Event](ctx, c, "/v1/events", q)
}

// Snapshots lists snapshots (owner: admin key only, "" = own).
func (c *Client) Snapshots(ctx context.Context, owner string) ([]wire.Snapshot, error) {
	return get[[]wire.Snapshot](ctx, c, "/v1/snapshots", ownerQuery(owner))
}

// GetSnapshot is GET /v1/snapshots/{id}.
func (c *Client) GetSnapshot(ctx context.Context, id string) (wire.Snapshot, error) {
	return get[wire.Snapshot](ctx, c, "/v1/snapshots/"+seg(id), nil)
}

// DeleteSnapshot removes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.Call(ctx, http.MethodDelete, "/v1/snapshots/"+seg(id), nil, nil, nil)
}

// PromoteSnapshot makes template name of a snapshot (admin key).
func (c *Client) PromoteSnapshot(ctx context.Context, id, name string) (wire.Template, error) {
	return send[wire.Template](ctx, c, http.MethodPost, "/v1/snapshots/"+seg(id)+"/template", wire.PromoteRequest{Name: name})
}

func ownerQuery(owner string) url.Values {
	if owner == "" {
		return nil
	}
	return url.Values{"owner": {owner}}
}

// CreateKey makes an API key acting as owner (admin key); it is shown once.
func (c *Client) CreateKey(ctx context.Context, owner string) (wire.KeyResponse, error) {
	return send[wire.KeyResponse](ctx, c, http.MethodPost, "/v1/keys", wire.KeyRequest{Owner: owner})
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/server"
)

// Client is the bench's way to the server: the public REST API only, the
// same surface as every other CLI verb.
type Client struct {
	Base string
	Key  string
	HC   *http.Client
}

// NewClient talks to base with key. Connections are kept alive (as any SDK
// would) and enough of them are pooled for the burst.
func NewClient(base, key string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	return &Client{Base: strings.TrimRight(base, "/"), Key: key, HC: &http.Client{Transport: tr}}
}

// APIError is a non-2xx answer.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message) }

// noRoute reports whether err is the server's catch-all 404: the route
// (feature) does not exist on this server, as opposed to a missing object.
func noRoute(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound && strings.HasPrefix(ae.Message, "no route for")
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, ct string) (*http.Response, error) {
	u := c.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.Key)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := c.HC.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e server.Error
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		return nil, &APIError{Status: resp.StatusCode, Message: msg}
	}
	return resp, nil
}

// Call sends in as JSON (nil: no body) and decodes the answer into out (nil: discard).
func (c *Client) Call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, nil, body, ct)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, path, err)
	}
	return nil
}

func sbPath(id string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// Create creates a sandbox; the server answers once its agent is ready.
func (c *Client) Create(ctx context.Context, req server.CreateRequest) (*sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	if err := c.Call(ctx, "POST", "/v1/sandboxes", req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Delete removes a sandbox.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.Call(ctx, "DELETE", sbPath(id), nil, nil)
}

// ExecResult is what came back from one exec.
type ExecResult struct {
	Stdout   string
	ExitCode int
}

// Exec runs cmd and reads the stream until the exit event.
func (c *Client) Exec(ctx context.Context, id string, cmd ...string) (ExecResult, error) {
	b, _ := json.Marshal(server.ExecRequest{Cmd: cmd})
	resp, err := c.do(ctx, "POST", sbPath(id, "exec"), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec %s: %w", id, err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	var out strings.Builder
	for {
		var ev agentapi.Event
		if err := dec.Decode(&ev); err != nil {
			return ExecResult{}, fmt.Errorf("exec %s: stream ended without exit: %w", id, err)
		}
		switch ev.Type {
		case "stdout":
			out.Write(ev.Data)
		case "error":
			return ExecResult{}, fmt.Errorf("exec %s: %s", id, ev.Error)
		case "exit":
			return ExecResult{Stdout: out.String(), ExitCode: ev.ExitCode}, nil
		}
	}
}

// Start starts cmd and returns once the process has started, leaving it
// running: closing the stream does not kill it.
func (c *Client) Start(ctx context.Context, id string, cmd ...string) error {
	b, _ := json.Marshal(server.ExecRequest{Cmd: cmd})
	resp, err := c.do(ctx, "POST", sbPath(id, "exec"), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return fmt.Errorf("exec %s: %w", id, err)
	}
	defer resp.Body.Close()
	var ev agentapi.Event
	if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil || ev.Type != "start" {
		return fmt.Errorf("exec %s: no start event (%v %s)", id, err, ev.Error)
	}
	return nil
}

// EchoOK runs `echo ok` and checks its output: the "ready" of every
// latency berth publishes.
func (c *Client) EchoOK(ctx context.Context, id string) error {
	r, err := c.Exec(ctx, id, "echo", "ok")
	if err != nil {
		return err
	}
	if r.Stdout != "ok\n" || r.ExitCode != 0 {
		return fmt.Errorf("echo ok in %s: got %q exit %d", id, r.Stdout, r.ExitCode)
	}
	return nil
}

// WriteFile uploads data to path (the agent fsyncs file and directory before answering).
func (c *Client) WriteFile(ctx context.Context, id, path string, data io.Reader) error {
	resp, err := c.do(ctx, "PUT", sbPath(id, "files"), url.Values{"path": {path}}, data, "application/octet-stream")
	if err != nil {
		return fmt.Errorf("upload %s:%s: %w", id, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// ReadFile downloads path into w.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	resp, err := c.do(ctx, "GET", sbPath(id, "files"), url.Values{"path": {path}}, nil, "")
	if err != nil {
		return 0, fmt.Errorf("download %s:%s: %w", id, path, err)
	}
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}

// Info is GET /v1/info.
func (c *Client) Info(ctx context.Context) (server.Info, error) {
	var in server.Info
	err := c.Call(ctx, "GET", "/v1/info", nil, &in)
	return in, err
}

// Pause pauses in mode and returns the sandbox as the server reports it.
func (c *Client) Pause(ctx context.Context, id string, mode sandbox.PauseMode) (*sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	err := c.Call(ctx, "POST", sbPath(id, "pause"), map[string]string{"mode": string(mode)}, &sb)
	return &sb, err
}

// Resume resumes a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	err := c.Call(ctx, "POST", sbPath(id, "resume"), nil, &sb)
	return &sb, err
}

// waitHealthy polls /v1/health until it answers or ctx ends.
func waitHealthy(ctx context.Context, base string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("berth at %s did not answer /v1/health within %s", base, limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pools is GET /v1/pools (admin key).
func (c *Client) Pools(ctx context.Context) ([]daemon.PoolStatus, error) {
	var out []daemon.PoolStatus
	err := c.Call(ctx, "GET", "/v1/pools", nil, &out)
	return out, err
}

// Pool is one template's entry in GET /v1/pools; ok is false when it has none.
func (c *Client) Pool(ctx context.Context, tpl string) (st daemon.PoolStatus, ok bool, err error) {
	list, err := c.Pools(ctx)
	for _, p := range list {
		if p.Template == tpl {
			return p, true, err
		}
	}
	return st, false, err
}

// SetPool is PUT /v1/pools/{template}.
func (c *Client) SetPool(ctx context.Context, tpl string, req server.PoolRequest) (daemon.PoolStatus, error) {
	var st daemon.PoolStatus
	err := c.Call(ctx, "PUT", "/v1/pools/"+url.PathEscape(tpl), req, &st)
	return st, err
}

// DeletePool is DELETE /v1/pools/{template}; the server drains its members.
func (c *Client) DeletePool(ctx context.Context, tpl string) error {
	return c.Call(ctx, "DELETE", "/v1/pools/"+url.PathEscape(tpl), nil, nil)
}

// Fork is POST /v1/sandboxes/{id}/fork {"count": n}.
func (c *Client) Fork(ctx context.Context, id string, n int) (checkpoint.ForkResult, error) {
	var res checkpoint.ForkResult
	err := c.Call(ctx, "POST", sbPath(id, "fork"), map[string]int{"count": n}, &res)
	return res, err
}

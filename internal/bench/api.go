package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// Client is the bench's way to the server: the public Go client (the same
// surface as every other CLI verb and users' code), plus the few helpers
// the measurements share.
type Client struct {
	*client.Client
	Base, Key string // for the E2B SDK run, which gets them in its environment
}

// NewClient talks to base with key. Connections are kept alive (as any SDK
// would) and enough of them are pooled for the burst.
func NewClient(base, key string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	base = strings.TrimRight(base, "/")
	return &Client{Client: client.New(base, key, client.WithHTTPClient(&http.Client{Transport: tr})), Base: base, Key: key}
}

// noRoute reports whether err is the server's catch-all 404: the route
// (feature) does not exist on this server, as opposed to a missing object.
func noRoute(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound && strings.HasPrefix(ae.Message, "no route for")
}

// Delete removes a sandbox.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.Sandbox(id).Delete(ctx)
}

// ExecResult is what came back from one exec.
type ExecResult struct {
	Stdout   string
	ExitCode int
}

// Exec runs cmd and reads the stream until the exit event.
func (c *Client) Exec(ctx context.Context, id string, cmd ...string) (ExecResult, error) {
	var out strings.Builder
	code, err := c.Sandbox(id).Run(ctx, wire.ExecRequest{Cmd: cmd}, &out, nil)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec %s: %w", id, err)
	}
	return ExecResult{Stdout: out.String(), ExitCode: code}, nil
}

// Start starts cmd and returns once the process has started, leaving it
// running: closing the stream does not kill it.
func (c *Client) Start(ctx context.Context, id string, cmd ...string) error {
	p, err := c.Sandbox(id).Exec(ctx, wire.ExecRequest{Cmd: cmd})
	if err != nil {
		return fmt.Errorf("exec %s: %w", id, err)
	}
	defer p.Close()
	ev, err := p.Next()
	if err != nil || ev.Type != wire.ExecStart {
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
	if _, err := c.Sandbox(id).WriteFile(ctx, path, data, client.WriteFileOptions{}); err != nil {
		return fmt.Errorf("upload %s:%s: %w", id, path, err)
	}
	return nil
}

// ReadFile downloads path into w.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	body, err := c.Sandbox(id).ReadFile(ctx, path, "")
	if err != nil {
		return 0, fmt.Errorf("download %s:%s: %w", id, path, err)
	}
	defer body.Close()
	return io.Copy(w, body)
}

// Pause pauses in mode and returns the sandbox as the server reports it.
func (c *Client) Pause(ctx context.Context, id string, mode wire.PauseMode) (*wire.Sandbox, error) {
	return c.Sandbox(id).Pause(ctx, mode)
}

// Resume resumes a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*wire.Sandbox, error) {
	return c.Sandbox(id).Resume(ctx)
}

// waitHealthy polls /v1/health until it answers or ctx ends.
func waitHealthy(ctx context.Context, base string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c := client.New(base, "")
	for {
		if c.Health(ctx) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("berth at %s did not answer /v1/health within %s", base, limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pool is one template's entry in GET /v1/pools; ok is false when it has none.
func (c *Client) Pool(ctx context.Context, tpl string) (st wire.PoolStatus, ok bool, err error) {
	list, err := c.Pools(ctx)
	for _, p := range list {
		if p.Template == tpl {
			return p, true, err
		}
	}
	return st, false, err
}

// Fork is POST /v1/sandboxes/{id}/fork {"count": n}.
func (c *Client) Fork(ctx context.Context, id string, n int) (wire.ForkResult, error) {
	return c.Sandbox(id).Fork(ctx, n)
}

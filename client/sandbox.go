package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// Sandbox is a handle on one sandbox: c.Sandbox(id).Exec(...). It holds no
// state of the sandbox; every method is one API call.
type Sandbox struct {
	c  *Client
	ID string
	// Owner, set by the admin key, acts on another owner's sandbox.
	Owner string
}

// Sandbox returns a handle on sandbox id.
func (c *Client) Sandbox(id string) *Sandbox { return &Sandbox{c: c, ID: id} }

func (s *Sandbox) path(rest ...string) string {
	p := "/v1/sandboxes/" + seg(s.ID)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

func (s *Sandbox) query(q url.Values) url.Values {
	if s.Owner != "" {
		if q == nil {
			q = url.Values{}
		}
		q.Set("owner", s.Owner)
	}
	return q
}

func (s *Sandbox) call(ctx context.Context, method string, q url.Values, in, out any, rest ...string) error {
	return s.c.Call(ctx, method, s.path(rest...), s.query(q), in, out)
}

func (s *Sandbox) sandbox(ctx context.Context, method string, in any, rest ...string) (*wire.Sandbox, error) {
	var sb wire.Sandbox
	if err := s.call(ctx, method, nil, in, &sb, rest...); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get is the sandbox as the server has it now.
func (s *Sandbox) Get(ctx context.Context) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodGet, nil)
}

// Delete removes the sandbox and its disk.
func (s *Sandbox) Delete(ctx context.Context) error {
	return s.call(ctx, http.MethodDelete, nil, nil, nil)
}

// Stop stops the sandbox's processes; its disk stays.
func (s *Sandbox) Stop(ctx context.Context) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, nil, "stop")
}

// Start boots a stopped sandbox again.
func (s *Sandbox) Start(ctx context.Context) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, nil, "start")
}

// Extend sets the sandbox to expire ttl (e.g. "30m", "1d") from now.
func (s *Sandbox) Extend(ctx context.Context, ttl string) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, wire.ExtendRequest{TTL: ttl}, "extend")
}

// Pause pauses in mode ("" = the server's default). The answer says which
// mode was actually taken (PauseActual) and why, if it differs.
func (s *Sandbox) Pause(ctx context.Context, mode wire.PauseMode) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, wire.PauseRequest{Mode: mode}, "pause")
}

// Resume resumes a paused sandbox.
func (s *Sandbox) Resume(ctx context.Context) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, nil, "resume")
}

// Lease keeps the reaper off the sandbox for d ("0" releases).
func (s *Sandbox) Lease(ctx context.Context, d string) (*wire.Sandbox, error) {
	return s.sandbox(ctx, http.MethodPost, wire.LeaseRequest{For: d}, "lease")
}

// Events lists the sandbox's lifecycle events.
func (s *Sandbox) Events(ctx context.Context) ([]wire.Event, error) {
	var list []wire.Event
	err := s.call(ctx, http.MethodGet, nil, nil, &list, "events")
	return list, err
}

// Snapshot captures the sandbox (name may be "").
func (s *Sandbox) Snapshot(ctx context.Context, name string) (wire.Snapshot, error) {
	var sn wire.Snapshot
	err := s.call(ctx, http.MethodPost, nil, wire.SnapshotRequest{Name: name}, &sn, "snapshot")
	return sn, err
}

// Fork snapshots the sandbox and starts n children from it.
func (s *Sandbox) Fork(ctx context.Context, n int) (wire.ForkResult, error) {
	var res wire.ForkResult
	err := s.call(ctx, http.MethodPost, nil, wire.ForkRequest{Count: &n}, &res, "fork")
	return res, err
}

// ReadFile opens path inside the sandbox for reading, as user ("" = the
// default user). The caller closes it.
func (s *Sandbox) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	resp, err := s.c.Do(ctx, http.MethodGet, s.path("files"), s.query(q), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFileOptions are a file write's owner and permissions.
type WriteFileOptions struct {
	User string // "" = the default user
	Mode uint32 // permission bits; 0 = 0644
}

// WriteFile writes r to path inside the sandbox (the agent syncs file and
// directory before answering).
func (s *Sandbox) WriteFile(ctx context.Context, path string, r io.Reader, o WriteFileOptions) (wire.EntryInfo, error) {
	q := url.Values{"path": {path}}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(o.Mode), 8))
	}
	var info wire.EntryInfo
	err := s.c.callBody(ctx, http.MethodPut, s.path("files"), s.query(q), r, "application/octet-stream", &info)
	return info, err
}

// ListDir lists path to depth (0 = 1).
func (s *Sandbox) ListDir(ctx context.Context, path string, depth int, user string) ([]wire.EntryInfo, error) {
	var list []wire.EntryInfo
	err := s.call(ctx, http.MethodPost, nil, wire.ListRequest{Path: path, Depth: depth, User: user}, &list, "fs", "list")
	return list, err
}

// Stat describes path.
func (s *Sandbox) Stat(ctx context.Context, path, user string) (wire.EntryInfo, error) {
	var e wire.EntryInfo
	err := s.call(ctx, http.MethodPost, nil, wire.PathRequest{Path: path, User: user}, &e, "fs", "stat")
	return e, err
}

// MakeDir creates path and its parents.
func (s *Sandbox) MakeDir(ctx context.Context, path, user string) error {
	return s.call(ctx, http.MethodPost, nil, wire.PathRequest{Path: path, User: user}, nil, "fs", "mkdir")
}

// Remove removes path (recursively).
func (s *Sandbox) Remove(ctx context.Context, path, user string) error {
	return s.call(ctx, http.MethodPost, nil, wire.PathRequest{Path: path, User: user}, nil, "fs", "remove")
}

// Move renames source to destination.
func (s *Sandbox) Move(ctx context.Context, source, destination, user string) (wire.EntryInfo, error) {
	var e wire.EntryInfo
	err := s.call(ctx, http.MethodPost, nil, wire.MoveRequest{Source: source, Destination: destination, User: user}, &e, "fs", "move")
	return e, err
}

// Network is the sandbox's egress policy, address, secrets and ports.
func (s *Sandbox) Network(ctx context.Context) (wire.NetworkInfo, error) {
	var n wire.NetworkInfo
	err := s.call(ctx, http.MethodGet, nil, nil, &n, "net")
	return n, err
}

// SetNetwork replaces the sandbox's egress policy.
func (s *Sandbox) SetNetwork(ctx context.Context, req wire.NetworkRequest) (wire.NetworkInfo, error) {
	var n wire.NetworkInfo
	err := s.call(ctx, http.MethodPut, nil, req, &n, "net")
	return n, err
}

// EgressLog is one page of the egress log after sequence number after
// (limit 0 = the server's default).
func (s *Sandbox) EgressLog(ctx context.Context, after int64, limit int) (wire.EgressLogResponse, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var page wire.EgressLogResponse
	err := s.call(ctx, http.MethodGet, q, nil, &page, "net", "log")
	return page, err
}

// ExposePort makes port reachable through the server's proxy; with token,
// a per-port access token (shown once) also grants access.
func (s *Sandbox) ExposePort(ctx context.Context, port int, token bool) (wire.PortResponse, error) {
	var p wire.PortResponse
	err := s.call(ctx, http.MethodPost, nil, wire.PortRequest{Port: port, Token: token}, &p, "ports")
	return p, err
}

// Ports lists the exposed ports.
func (s *Sandbox) Ports(ctx context.Context) ([]wire.PortResponse, error) {
	var l wire.PortList
	err := s.call(ctx, http.MethodGet, nil, nil, &l, "ports")
	return l.Ports, err
}

// ClosePort stops exposing port.
func (s *Sandbox) ClosePort(ctx context.Context, port int) error {
	return s.call(ctx, http.MethodDelete, nil, nil, nil, "ports", strconv.Itoa(port))
}

// callBody sends a raw body and decodes a JSON answer into out.
func (c *Client) callBody(ctx context.Context, method, path string, q url.Values, body io.Reader, ct string, out any) error {
	resp, err := c.Do(ctx, method, path, q, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return decodeJSON(resp.Body, out, method+" "+path)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// WaitState polls until the sandbox is in one of states, or ctx ends.
func (s *Sandbox) WaitState(ctx context.Context, every time.Duration, states ...wire.State) (*wire.Sandbox, error) {
	for {
		sb, err := s.Get(ctx)
		if err != nil {
			return nil, err
		}
		for _, st := range states {
			if sb.State == st {
				return sb, nil
			}
		}
		select {
		case <-ctx.Done():
			return sb, fmt.Errorf("sandbox %s is %s, not %v: %w", s.ID, sb.State, states, ctx.Err())
		case <-time.After(every):
		}
	}
}

package agentapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Client talks to one berth-agent over its authenticated channel. Every
// answer is bounded: control answers by MaxControlBytes, each streamed
// event by MaxEventBytes, headers by MaxHeaderBytes; an agent that sends
// more gets an error, never the daemon's memory.
type Client struct {
	socket string
	http   *http.Client
	tr     *http.Transport
	obs    Observer // nil: nobody watches (observer.go)
}

// Bounds on what the daemon reads from an agent.
const (
	MaxControlBytes = 16 << 20 // one JSON answer (a large directory listing)
	MaxEventBytes   = 4 << 20  // one streamed event line
	MaxHeaderBytes  = 64 << 10
	maxErrorBytes   = 64 << 10
)

// newClient returns a client whose connections are streams from dial.
func newClient(name string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		// Connections are kept alive and reused (each is a plain unix
		// socket: a write reported as failed did not go out). Requests that
		// change state are made non-replayable in do.
		MaxIdleConnsPerHost:    MaxConns,
		IdleConnTimeout:        90 * time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: MaxHeaderBytes,
		WriteBufferSize:        64 << 10,
		ReadBufferSize:         64 << 10,
	}
	return &Client{socket: name, http: &http.Client{Transport: tr}, tr: tr}
}

// CloseIdle drops idle connections (their identity was revoked, or the
// agent is quiescing).
func (c *Client) CloseIdle() { c.tr.CloseIdleConnections() }

// errTooLarge is what a bounded read returns past its limit.
type errTooLarge struct{ limit int64 }

func (e errTooLarge) Error() string {
	return fmt.Sprintf("agent answer exceeds %d bytes", e.limit)
}

// capReader fails (rather than truncates) once more than n bytes are read.
type capReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func newCapReader(r io.Reader, limit int64) *capReader {
	return &capReader{r: r, n: limit, limit: limit}
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.n < 0 {
		return 0, errTooLarge{c.limit}
	}
	if int64(len(p)) > c.n+1 {
		p = p[:c.n+1]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	if c.n < 0 {
		return n - int(-c.n), errTooLarge{c.limit}
	}
	return n, err
}

// decodeBounded decodes one JSON value of at most limit bytes.
func (c *Client) decodeBounded(r io.Reader, limit int64, out any, route string) error {
	if err := json.NewDecoder(newCapReader(r, limit)).Decode(out); err != nil {
		var tl errTooLarge
		if errors.As(err, &tl) {
			return errs.Wrap(errs.ResourceExhausted, err, "agent %s: %s", c.socket, route)
		}
		return c.transportError(err, route)
	}
	return nil
}

// readLine reads one newline-terminated line of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit {
			return nil, errs.Wrap(errs.ResourceExhausted, errTooLarge{int64(limit)}, "agent stream event")
		}
		line = append(line, frag...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if err == io.EOF && len(bytes.TrimSpace(line)) > 0 {
				return line, nil
			}
			return nil, err
		}
	}
}

// eventReader decodes newline-delimited JSON events, each bounded.
type eventReader struct{ br *bufio.Reader }

func newEventReader(r io.Reader) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, 64<<10)}
}

func (e *eventReader) next(v any) error {
	for {
		line, err := readLine(e.br, MaxEventBytes)
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return json.Unmarshal(line, v)
	}
}

// kindByName decodes the agent's error code; unknown codes are Internal.
func kindByName(code string) errs.Kind {
	k, _ := errs.KindNamed(code)
	return k
}

// transportError classifies a failure to reach the agent: a missing socket
// or refused connection means the agent is not (yet, or no longer) there.
func (c *Client) transportError(err error, route string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var e *errs.Error
	if errors.As(err, &e) { // the channel's own verdict (not connected, closed)
		return errs.Wrap(e.Kind, err, "agent %s: %s", c.socket, route)
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		// net/http's unexported errServerClosedIdle: the agent closed the
		// connection as the request went out (it is quiescing or leaving).
		strings.Contains(err.Error(), "server closed idle connection") {
		return errs.Wrap(errs.Unavailable, err, "agent %s: %s", c.socket, route)
	}
	return errs.Wrap(errs.Internal, err, "agent %s: %s", c.socket, route)
}

// do sends one request and returns the response when it is 2xx; otherwise
// it decodes the agent's Error body into an *errs.Error.
func (c *Client) do(ctx context.Context, method, route string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := "http://agent" + route
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "build request %s", route)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if method != http.MethodGet {
		// net/http replays a request with a rewindable body that it believes
		// unsent on a reused connection; nothing but a GET is ever sent twice.
		req.GetBody = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(err, route)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	var e Error
	if err := json.Unmarshal(b, &e); err != nil || e.Code == "" {
		return nil, errs.E(errs.Internal, "agent %s: %s: HTTP %d: %s", c.socket, route, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil, &errs.Error{Kind: kindByName(e.Code), Message: e.Message}
}

func (c *Client) doJSON(ctx context.Context, method, route string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "encode %s request", route)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, route, nil, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBytes))
		return nil
	}
	if err := c.decodeBounded(resp.Body, MaxControlBytes, out, route); err != nil {
		return err
	}
	// The rest (a newline) lets the connection be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainMax))
	return nil
}

func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.doJSON(ctx, http.MethodGet, "/health", nil, &h)
	return h, err
}

func (c *Client) Activity(ctx context.Context) (Activity, error) {
	var a Activity
	err := c.doJSON(ctx, http.MethodGet, "/activity", nil, &a)
	return a, err
}

// Stream is an exec or attach event stream.
type Stream struct {
	body   io.ReadCloser
	dec    *eventReader
	done   bool
	exited bool               // the exit event came: the answer ends right after it
	cancel context.CancelFunc // ends the request
	obs    ExecObserver       // nil unless the client has an Observer
	timing ExecTiming
	phases *ExecPhases // the agent's, from its exit event
}

// Next returns the next event; io.EOF after the exit event. A stream cut
// before its exit event returns an errs.Unavailable error.
func (s *Stream) Next() (Event, error) {
	if s.done {
		return Event{}, io.EOF
	}
	var sev StreamEvent
	if err := s.dec.next(&sev); err != nil {
		s.done = true
		if s.obs != nil {
			s.obs.Closed()
		}
		if errs.Is(err, errs.ResourceExhausted) {
			return Event{}, err
		}
		return Event{}, errs.Wrap(errs.Unavailable, err, "agent stream ended before exit")
	}
	ev := sev.Event
	if ev.Type == "exit" {
		s.done, s.exited = true, true
		s.phases = sev.Phases
	}
	if s.obs != nil {
		s.obs.Event(&ev)
	}
	return ev, nil
}

// After its exit event a stream's answer ends at once; Close reads that
// end (at most drainMax bytes, for at most drainWait) so the connection
// is reused rather than closed and redialed.
const (
	drainMax  = 4 << 10
	drainWait = 50 * time.Millisecond
)

// Close ends the stream; the process keeps running.
func (s *Stream) Close() error {
	if s.exited {
		t := time.AfterFunc(drainWait, s.cancel)
		_, _ = io.CopyN(io.Discard, s.dec.br, drainMax)
		t.Stop()
	}
	err := s.body.Close()
	s.cancel()
	if s.obs != nil {
		s.obs.Closed()
	}
	return err
}

func keepaliveQuery(sec int) url.Values {
	if sec <= 0 {
		return nil
	}
	return url.Values{"keepalive": {strconv.Itoa(sec)}}
}

func newStream(resp *http.Response, cancel context.CancelFunc) *Stream {
	return &Stream{body: resp.Body, dec: newEventReader(resp.Body), cancel: cancel}
}

// ExecTiming is where an exec's start went on the daemon's side of the
// channel: Conn until a connection to the agent was in hand (Reused: one
// kept alive from an earlier request, else a spare the agent had dialed),
// Answer until the agent's response headers (it answers once the process
// has been spawned).
type ExecTiming struct {
	Conn, Answer time.Duration
	Reused       bool
}

// Timing reports the start of the exec this stream belongs to.
func (s *Stream) Timing() ExecTiming { return s.timing }

// Phases is what the agent reported on the exit event (nil before it, or
// if it said nothing); call it from the goroutine that read the exit, or
// after it (its Next happens before).
func (s *Stream) Phases() *ExecPhases { return s.phases }

// Exec starts a process and streams its events, "start" first. Closing the
// stream does not stop the process.
func (c *Client) Exec(ctx context.Context, req ExecRequest, keepaliveSec int) (*Stream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "encode exec request")
	}
	var tm ExecTiming
	t0 := time.Now()
	ctx, cancel := context.WithCancel(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) { tm.Conn, tm.Reused = time.Since(t0), ci.Reused },
	}))
	resp, err := c.do(ctx, http.MethodPost, "/exec", keepaliveQuery(keepaliveSec), bytes.NewReader(b), "application/json")
	if err != nil {
		cancel()
		return nil, err
	}
	tm.Answer = time.Since(t0)
	st := newStream(resp, cancel)
	st.timing = tm
	if c.obs != nil {
		st.obs = c.obs.Exec(req)
	}
	return st, nil
}

// Attach streams a process's new output and its exit.
func (c *Client) Attach(ctx context.Context, pid int, keepaliveSec int) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	resp, err := c.do(ctx, http.MethodPost, fmt.Sprintf("/processes/%d/attach", pid), keepaliveQuery(keepaliveSec), nil, "")
	if err != nil {
		cancel()
		return nil, err
	}
	return newStream(resp, cancel), nil
}

func (c *Client) Processes(ctx context.Context) ([]ProcessInfo, error) {
	var list []ProcessInfo
	err := c.doJSON(ctx, http.MethodGet, "/processes", nil, &list)
	return list, err
}

func (c *Client) Input(ctx context.Context, pid int, data []byte) error {
	resp, err := c.do(ctx, http.MethodPost, fmt.Sprintf("/processes/%d/input", pid), nil, bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	if c.obs != nil {
		c.obs.Input(pid, len(data))
	}
	return resp.Body.Close()
}

func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.doJSON(ctx, http.MethodPost, fmt.Sprintf("/processes/%d/close-stdin", pid), nil, nil)
}

func (c *Client) Signal(ctx context.Context, pid, sig int) error {
	return c.doJSON(ctx, http.MethodPost, fmt.Sprintf("/processes/%d/signal", pid), SignalRequest{Signal: sig}, nil)
}

func (c *Client) Resize(ctx context.Context, pid int, cols, rows uint16) error {
	return c.doJSON(ctx, http.MethodPost, fmt.Sprintf("/processes/%d/resize", pid), ResizeRequest{Cols: cols, Rows: rows}, nil)
}

// ReadFile streams a file; the size is its Content-Length.
func (c *Client) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, int64, error) {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	resp, err := c.do(ctx, http.MethodGet, "/files", q, nil, "")
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFile streams r into path (created or replaced); mode 0 keeps the
// agent's default.
func (c *Client) WriteFile(ctx context.Context, path, user string, mode os.FileMode, r io.Reader) (EntryInfo, error) {
	return c.WriteFileMetadata(ctx, path, user, mode, nil, r)
}

// WriteFileMetadata is WriteFile that also sets the file's metadata (its
// user.e2b.* xattrs, see metadata.go) to meta; nil sets none.
func (c *Client) WriteFileMetadata(ctx context.Context, path, user string, mode os.FileMode, meta map[string]string, r io.Reader) (EntryInfo, error) {
	q := url.Values{"path": {path}}
	if meta != nil {
		if err := ValidateMetadata("metadata.", meta); err != nil {
			return EntryInfo{}, err
		}
		q.Set("metadata", EncodeMetadata(meta))
	}
	if user != "" {
		q.Set("user", user)
	}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	if r == nil {
		r = http.NoBody
	} else {
		r = bulkBody{r}
	}
	resp, err := c.do(ctx, http.MethodPut, "/files", q, r, "application/octet-stream")
	if err != nil {
		return EntryInfo{}, err
	}
	defer resp.Body.Close()
	var info EntryInfo
	if err := c.decodeBounded(resp.Body, MaxControlBytes, &info, "/files"); err != nil {
		return EntryInfo{}, err
	}
	if c.obs != nil {
		c.obs.FileChanged("write", path, "", info.Size)
	}
	return info, nil
}

func (c *Client) Stat(ctx context.Context, req PathRequest) (EntryInfo, error) {
	var info EntryInfo
	err := c.doJSON(ctx, http.MethodPost, "/fs/stat", req, &info)
	return info, err
}

func (c *Client) Mkdir(ctx context.Context, req PathRequest) (EntryInfo, error) {
	var info EntryInfo
	err := c.doJSON(ctx, http.MethodPost, "/fs/mkdir", req, &info)
	if err == nil && c.obs != nil {
		c.obs.FileChanged("mkdir", req.Path, "", 0)
	}
	return info, err
}

func (c *Client) Remove(ctx context.Context, req PathRequest) error {
	err := c.doJSON(ctx, http.MethodPost, "/fs/remove", req, nil)
	if err == nil && c.obs != nil {
		c.obs.FileChanged("remove", req.Path, "", 0)
	}
	return err
}

func (c *Client) List(ctx context.Context, req ListRequest) ([]EntryInfo, error) {
	var list []EntryInfo
	err := c.doJSON(ctx, http.MethodPost, "/fs/list", req, &list)
	return list, err
}

func (c *Client) Move(ctx context.Context, req MoveRequest) (EntryInfo, error) {
	var info EntryInfo
	err := c.doJSON(ctx, http.MethodPost, "/fs/move", req, &info)
	if err == nil && c.obs != nil {
		c.obs.FileChanged("move", req.Source, req.Destination, info.Size)
	}
	return info, err
}

// WatchStream is a stream of filesystem events, {"type":"start"} first.
type WatchStream struct {
	body io.ReadCloser
	dec  *eventReader
}

// Next returns the next event. The stream has no natural end: it ends when
// the context or Close ends it (an errs.Unavailable error).
func (s *WatchStream) Next() (FSEvent, error) {
	var ev FSEvent
	if err := s.dec.next(&ev); err != nil {
		if errs.Is(err, errs.ResourceExhausted) {
			return FSEvent{}, err
		}
		return FSEvent{}, errs.Wrap(errs.Unavailable, err, "agent watch stream ended")
	}
	return ev, nil
}

func (s *WatchStream) Close() error { return s.body.Close() }

func (c *Client) Watch(ctx context.Context, req WatchRequest, keepaliveSec int) (*WatchStream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "encode watch request")
	}
	resp, err := c.do(ctx, http.MethodPost, "/fs/watch", keepaliveQuery(keepaliveSec), bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	return &WatchStream{body: resp.Body, dec: newEventReader(resp.Body)}, nil
}

func (c *Client) Restored(ctx context.Context, req RestoredRequest) error {
	return c.doJSON(ctx, http.MethodPost, "/restored", req, nil)
}

// WaitReady polls /health until the agent answers, starting at 1 ms and
// backing off to interval; it returns the context's error if that ends first.
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) (Health, error) {
	delay := time.Millisecond
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	for {
		h, err := c.Health(ctx)
		if err == nil {
			return h, nil
		}
		if ctx.Err() != nil {
			return Health{}, errs.Reclassify(errs.Unavailable, err, "agent not ready")
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return Health{}, errs.Reclassify(errs.Unavailable, err, "agent not ready")
		case <-t.C:
		}
		delay = min(delay*2, interval)
	}
}

package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/berth-dev/berth/internal/errs"
)

// Watch event types.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Bookmark = "BOOKMARK"
	Error    = "ERROR"
)

// WatchEvent is one line of a watch stream.
type WatchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Watcher reads a watch stream. Close it when done.
type Watcher struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// maxWatchLine bounds one event (one object) on a watch stream.
const maxWatchLine = 8 << 20

// Watch opens a watch on the collection from opts.ResourceVersion ("" =
// from now, after a synthetic ADDED per existing object).
func (c *Client) Watch(ctx context.Context, r Resource, ns string, opts ListOptions) (*Watcher, error) {
	req, err := c.request(ctx, http.MethodGet, r.Path(ns), opts.query(true), "", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.stream.Do(req)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "kubernetes watch %s", r.Plural)
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, statusError("WATCH", r.Path(ns), resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxWatchLine)
	return &Watcher{body: resp.Body, sc: sc}, nil
}

// Next blocks for the next event. io.EOF: the server ended the stream
// (re-watch from the last resourceVersion seen). An ERROR event with a
// 410 Status comes back as *GoneError.
func (w *Watcher) Next() (WatchEvent, error) {
	for w.sc.Scan() {
		var ev WatchEvent
		if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
			return WatchEvent{}, errs.Wrap(errs.Unavailable, err, "kubernetes watch: bad event")
		}
		if ev.Type == Error {
			var st Status
			_ = json.Unmarshal(ev.Object, &st)
			return WatchEvent{}, statusError("WATCH", "", st.Code, ev.Object)
		}
		return ev, nil
	}
	if err := w.sc.Err(); err != nil {
		return WatchEvent{}, errs.Wrap(errs.Unavailable, err, "kubernetes watch")
	}
	return WatchEvent{}, io.EOF
}

// Close ends the stream.
func (w *Watcher) Close() error { return w.body.Close() }

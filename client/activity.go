package client

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/api/wire"
)

// ActivityOptions selects entries of a sandbox's activity timeline.
type ActivityOptions struct {
	After int64    // only entries with a larger seq
	Limit int      // 0 = the server's default (1000)
	Kinds []string // wire.Activity* kinds; empty = every kind
}

func (o ActivityOptions) query(follow bool) url.Values {
	q := url.Values{}
	if o.After > 0 {
		q.Set("after", strconv.FormatInt(o.After, 10))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if len(o.Kinds) > 0 {
		q.Set("kind", strings.Join(o.Kinds, ","))
	}
	if follow {
		q.Set("follow", "true")
	}
	return q
}

// Activity is one page of the sandbox's activity timeline (GET
// /v1/sandboxes/{id}/activity); pass the answer's Next as After for the next.
func (s *Sandbox) Activity(ctx context.Context, o ActivityOptions) (wire.ActivityList, error) {
	var list wire.ActivityList
	err := s.call(ctx, http.MethodGet, o.query(false), nil, &list, "activity")
	return list, err
}

// ActivityStream is a followed timeline: the entries after
// ActivityOptions.After, then new ones as they happen.
type ActivityStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// FollowActivity opens the timeline with follow=true. The stream ends
// (io.EOF) when the sandbox is deleted; cancel ctx or Close to stop.
func (s *Sandbox) FollowActivity(ctx context.Context, o ActivityOptions) (*ActivityStream, error) {
	resp, err := s.c.Do(ctx, http.MethodGet, s.path("activity"), s.query(o.query(true)), nil, "")
	if err != nil {
		return nil, err
	}
	return &ActivityStream{body: resp.Body, dec: json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))}, nil
}

// Next returns the next entry, io.EOF at the end of the stream.
func (a *ActivityStream) Next() (wire.ActivityEntry, error) {
	var e wire.ActivityEntry
	err := a.dec.Decode(&e)
	return e, err
}

// Close ends the stream.
func (a *ActivityStream) Close() error { return a.body.Close() }

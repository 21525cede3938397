package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berth-dev/berth/api/wire"
)

// DiffOptions shape a diff (GET /v1/sandboxes/{id}/diff).
type DiffOptions struct {
	// Against is "" (the sandbox's changes since its fork point), another
	// sandbox's id (the changes that turn this sandbox's tree into that
	// one's) or "checkpoint:ID".
	Against string
	Paths   []string // prefixes or path.Match patterns
	Stat    bool     // no unified text, line counts only
	MaxText int64    // largest file diffed as text; 0 = 1 MiB
}

// Diff is the sandbox's file-level changes.
func (s *Sandbox) Diff(ctx context.Context, o DiffOptions) (wire.DiffResult, error) {
	q := url.Values{}
	if o.Against != "" {
		q.Set("against", o.Against)
	}
	for _, p := range o.Paths {
		q.Add("path", p)
	}
	if o.Stat {
		q.Set("stat", "true")
	}
	if o.MaxText != 0 {
		q.Set("max_text", strconv.FormatInt(o.MaxText, 10))
	}
	var res wire.DiffResult
	err := s.call(ctx, http.MethodGet, q, nil, &res, "diff")
	return res, err
}

// Compare reports the sandbox's children: diff stat, check run, cost;
// passing first, then by diff size.
func (s *Sandbox) Compare(ctx context.Context, req wire.CompareRequest) (wire.CompareResult, error) {
	var res wire.CompareResult
	err := s.call(ctx, http.MethodPost, nil, req, &res, "compare")
	return res, err
}

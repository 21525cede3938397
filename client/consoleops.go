package client

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// SeriesOptions selects GET /v1/usage/series; zero fields take the
// server's defaults (by owner, 1 h buckets, the last 24 h).
type SeriesOptions struct {
	Owner    string        // admin key only; "" = every owner
	By       string        // owner | template
	Step     time.Duration // a whole number of hours
	From, To time.Time
}

// UsageSeries is cost over time per owner or template, on both bases.
func (c *Client) UsageSeries(ctx context.Context, o SeriesOptions) (wire.UsageSeries, error) {
	q := url.Values{}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	if o.By != "" {
		q.Set("by", o.By)
	}
	if o.Step != 0 {
		q.Set("step", o.Step.String())
	}
	if !o.From.IsZero() {
		q.Set("from", o.From.Format(time.RFC3339))
	}
	if !o.To.IsZero() {
		q.Set("to", o.To.Format(time.RFC3339))
	}
	return get[wire.UsageSeries](ctx, c, "/v1/usage/series", q)
}

// CleanupOrphans deletes the named sandboxes and snapshots that are still
// orphans of the report for req.Days; the rest are refused with a reason.
func (c *Client) CleanupOrphans(ctx context.Context, req wire.OrphanCleanupRequest) (wire.OrphanCleanupResult, error) {
	return send[wire.OrphanCleanupResult](ctx, c, "POST", "/v1/reports/orphans/cleanup", req)
}

// TemplateBuilds is the build history of template ("" = every template),
// newest first, at most limit (0 = all kept).
func (c *Client) TemplateBuilds(ctx context.Context, template string, limit int) ([]wire.TemplateBuild, error) {
	q := url.Values{}
	if template != "" {
		q.Set("template", template)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	l, err := get[wire.TemplateBuildList](ctx, c, "/v1/builds", q)
	return l.Builds, err
}

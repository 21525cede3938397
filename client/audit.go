package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// AuditOptions selects entries of the audit chain.
type AuditOptions struct {
	After   int64     // only entries with a larger seq (a page's Next)
	Since   time.Time // only entries at or after
	Sandbox string    // only this sandbox's entries
	Owner   string    // only this owner's (admin key only)
	Limit   int       // 0 = the server's default (1000)
}

// Audit is one page of the audit chain (GET /v1/audit), oldest first:
// an owner's key sees its own entries, the admin key all.
func (c *Client) Audit(ctx context.Context, o AuditOptions) (wire.AuditList, error) {
	q := url.Values{}
	if o.After > 0 {
		q.Set("after", strconv.FormatInt(o.After, 10))
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if o.Sandbox != "" {
		q.Set("sandbox", o.Sandbox)
	}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	return get[wire.AuditList](ctx, c, "/v1/audit", q)
}

// VerifyAudit walks the whole chain on the server (POST /v1/audit/verify,
// admin key): Report.OK is false when an entry was changed, removed or
// reordered, or the tail truncated.
func (c *Client) VerifyAudit(ctx context.Context) (wire.AuditReport, error) {
	var rep wire.AuditReport
	err := c.Call(ctx, http.MethodPost, "/v1/audit/verify", nil, nil, &rep)
	return rep, err
}

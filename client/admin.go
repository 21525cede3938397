package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth/api/wire"
)

// Templates lists every template.
func (c *Client) Templates(ctx context.Context) ([]wire.Template, error) {
	return get[[]wire.Template](ctx, c, "/v1/templates", nil)
}

// Template is GET /v1/templates/{name}.
func (c *Client) Template(ctx context.Context, name string) (wire.Template, error) {
	return get[wire.Template](ctx, c, "/v1/templates/"+seg(name), nil)
}

// ImportTemplate stores a rootfs tarball as template name (admin key);
// source is a free-text note of where it came from.
func (c *Client) ImportTemplate(ctx context.Context, name string, tar io.Reader, source string) (wire.Template, error) {
	var q url.Values
	if source != "" {
		q = url.Values{"source": {source}}
	}
	resp, err := c.Do(ctx, http.MethodPut, "/v1/templates/"+seg(name)+"/tar", q, tar, "application/x-tar")
	if err != nil {
		return wire.Template{}, err
	}
	defer resp.Body.Close()
	var t wire.Template
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		return t, fmt.Errorf("decode template import response: %w", err)
	}
	return t, nil
}

// DeleteTemplate removes a template and collects the layers nothing uses.
func (c *Client) DeleteTemplate(ctx context.Context, name string) (wire.TemplateDeleted, error) {
	return send[wire.TemplateDeleted](ctx, c, http.MethodDelete, "/v1/templates/"+seg(name), nil)
}

// PullTemplate makes template name of an OCI image (admin key), calling
// progress (may be nil) for each progress line of the stream.
func (c *Client) PullTemplate(ctx context.Context, name string, req wire.PullRequest, progress func(wire.BuildEvent)) (wire.Template, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return wire.Template{}, err
	}
	resp, err := c.Do(ctx, http.MethodPost, "/v1/templates/"+seg(name)+"/pull", nil, bytesReader(b), "application/json")
	if err != nil {
		return wire.Template{}, err
	}
	return readBuildStream(resp, progress)
}

// BuildOptions are a Dockerfile build's parameters.
type BuildOptions struct {
	Dockerfile string   // path inside the context; "" = Dockerfile
	BuildArgs  []string // ARG values, each NAME=VALUE
	Network    string   // RUN steps' network: "" or deny-all, allow-all
	NoCache    bool
}

// BuildTemplate builds template name from a Dockerfile in contextTar (a tar
// stream of the build context; admin key), calling progress (may be nil)
// for each progress line.
func (c *Client) BuildTemplate(ctx context.Context, name string, contextTar io.Reader, o BuildOptions, progress func(wire.BuildEvent)) (wire.Template, error) {
	q := url.Values{}
	if o.Dockerfile != "" {
		q.Set("dockerfile", o.Dockerfile)
	}
	for _, a := range o.BuildArgs {
		q.Add("build_arg", a)
	}
	if o.Network != "" {
		q.Set("network", o.Network)
	}
	if o.NoCache {
		q.Set("no_cache", "true")
	}
	resp, err := c.Do(ctx, http.MethodPost, "/v1/templates/"+seg(name)+"/build", q, contextTar, "application/x-tar")
	if err != nil {
		return wire.Template{}, err
	}
	return readBuildStream(resp, progress)
}

// maxLine bounds one line of a stream.
const maxLine = 16 << 20

func readBuildStream(resp *http.Response, progress func(wire.BuildEvent)) (wire.Template, error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), maxLine)
	for sc.Scan() {
		var ev wire.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return wire.Template{}, &Error{Kind: KindUnavailable, Message: "bad progress line from server", Err: err}
		}
		switch ev.Type {
		case "result":
			if ev.Template == nil {
				return wire.Template{}, errors.New("template stream: result without a template")
			}
			return *ev.Template, nil
		case "error":
			if ev.Error == nil {
				return wire.Template{}, &Error{Kind: KindInternal, Message: "template stream: error without a body"}
			}
			return wire.Template{}, &Error{StatusCode: ev.Error.Code, Kind: ev.Error.Reason, Field: ev.Error.Field, Message: ev.Error.Message}
		default:
			if progress != nil {
				progress(ev)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return wire.Template{}, &Error{Kind: KindUnavailable, Message: "progress stream", Err: err}
	}
	return wire.Template{}, &Error{Kind: KindUnavailable, Message: "the server ended the stream without a result"}
}

// Pools lists the warm pools (admin key).
func (c *Client) Pools(ctx context.Context) ([]wire.PoolStatus, error) {
	return get[[]wire.PoolStatus](ctx, c, "/v1/pools", nil)
}

// SetPool configures template's warm pool (admin key).
func (c *Client) SetPool(ctx context.Context, template string, req wire.PoolRequest) (wire.PoolStatus, error) {
	return send[wire.PoolStatus](ctx, c, http.MethodPut, "/v1/pools/"+seg(template), req)
}

// DeletePool removes template's pool; the server drains its members.
func (c *Client) DeletePool(ctx context.Context, template string) error {
	return c.Call(ctx, http.MethodDelete, "/v1/pools/"+seg(template), nil, nil, nil)
}

// Secrets lists the secrets of owner ("" = the key's own; another: admin key).
func (c *Client) Secrets(ctx context.Context, owner string) ([]wire.SecretInfo, error) {
	l, err := get[wire.SecretList](ctx, c, "/v1/secrets", ownerQuery(owner))
	return l.Secrets, err
}

// PutSecret stores secret name of owner ("" = own).
func (c *Client) PutSecret(ctx context.Context, owner, name string, req wire.SecretRequest) (wire.SecretInfo, error) {
	var info wire.SecretInfo
	err := c.Call(ctx, http.MethodPut, "/v1/secrets/"+seg(name), ownerQuery(owner), req, &info)
	return info, err
}

// DeleteSecret removes secret name of owner ("" = own).
func (c *Client) DeleteSecret(ctx context.Context, owner, name string) error {
	return c.Call(ctx, http.MethodDelete, "/v1/secrets/"+seg(name), ownerQuery(owner), nil, nil)
}

// UsageOptions filter GET /v1/usage.
type UsageOptions struct {
	Owner     string    // admin key only
	Since     time.Time // zero: since the beginning
	SinceText string    // or an RFC 3339 time or a duration ("24h", "7d"), as the server parses it
	SandboxID string
}

// Usage is metered usage per owner and per sandbox.
func (c *Client) Usage(ctx context.Context, o UsageOptions) (wire.UsageReport, error) {
	q := url.Values{}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.Format(time.RFC3339))
	} else if o.SinceText != "" {
		q.Set("since", o.SinceText)
	}
	if o.SandboxID != "" {
		q.Set("sandbox", o.SandboxID)
	}
	return get[wire.UsageReport](ctx, c, "/v1/usage", q)
}

// Orphans reports sandboxes, snapshots and templates idle for days (owner:
// admin key only).
func (c *Client) Orphans(ctx context.Context, days int, owner string) (wire.OrphanReport, error) {
	q := url.Values{"days": {strconv.Itoa(days)}}
	if owner != "" {
		q.Set("owner", owner)
	}
	return get[wire.OrphanReport](ctx, c, "/v1/reports/orphans", q)
}

// Quotas lists quotas: every owner's for the admin key, else the key's own.
func (c *Client) Quotas(ctx context.Context) ([]wire.QuotaInfo, error) {
	return get[[]wire.QuotaInfo](ctx, c, "/v1/quotas", nil)
}

// Quota is one owner's quota.
func (c *Client) Quota(ctx context.Context, owner string) (wire.QuotaInfo, error) {
	return get[wire.QuotaInfo](ctx, c, "/v1/quotas/"+seg(owner), nil)
}

// SetQuota stores owner's limits (admin key).
func (c *Client) SetQuota(ctx context.Context, owner string, l wire.QuotaLimits) (wire.QuotaInfo, error) {
	return send[wire.QuotaInfo](ctx, c, http.MethodPut, "/v1/quotas/"+seg(owner), l)
}

// DeleteQuota removes owner's stored limits (admin key).
func (c *Client) DeleteQuota(ctx context.Context, owner string) error {
	return c.Call(ctx, http.MethodDelete, "/v1/quotas/"+seg(owner), nil, nil, nil)
}

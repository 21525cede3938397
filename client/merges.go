package client

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth/api/wire"
)

// Merge merges the fork req.Source into the sandbox target (three-way
// against their fork point). A merge with conflicts comes back with state
// "conflicted": see Conflicts and Resolve.
func (c *Client) Merge(ctx context.Context, target string, req wire.MergeRequest) (wire.Merge, error) {
	return send[wire.Merge](ctx, c, http.MethodPost, "/v1/sandboxes/"+seg(target)+"/merges", req)
}

// Merges lists the merges into target, oldest first.
func (c *Client) Merges(ctx context.Context, target string) ([]wire.Merge, error) {
	return get[[]wire.Merge](ctx, c, "/v1/sandboxes/"+seg(target)+"/merges", nil)
}

// GetMerge is one merge into target.
func (c *Client) GetMerge(ctx context.Context, target, id string) (wire.Merge, error) {
	return get[wire.Merge](ctx, c, "/v1/sandboxes/"+seg(target)+"/merges/"+seg(id), nil)
}

// OpenMerge is target's open (planned or conflicted) merge, if any.
func (c *Client) OpenMerge(ctx context.Context, target string) (wire.Merge, bool, error) {
	list, err := c.Merges(ctx, target)
	if err != nil {
		return wire.Merge{}, false, err
	}
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].State == "planned" || list[i].State == "conflicted" {
			return list[i], true, nil
		}
	}
	return wire.Merge{}, false, nil
}

// AbortMerge drops target's open merge id.
func (c *Client) AbortMerge(ctx context.Context, target, id string) (wire.Merge, error) {
	return send[wire.Merge](ctx, c, http.MethodPost, "/v1/sandboxes/"+seg(target)+"/merges/"+seg(id)+"/abort", nil)
}

// ContinueMerge applies target's open merge id once its conflicts are resolved.
func (c *Client) ContinueMerge(ctx context.Context, target, id string) (wire.Merge, error) {
	return send[wire.Merge](ctx, c, http.MethodPost, "/v1/sandboxes/"+seg(target)+"/merges/"+seg(id)+"/continue", nil)
}

// Conflicts lists the unresolved conflicts of target's open merge.
func (c *Client) Conflicts(ctx context.Context, target string) ([]wire.Conflict, error) {
	return get[[]wire.Conflict](ctx, c, "/v1/sandboxes/"+seg(target)+"/conflicts", nil)
}

// Resolve settles one conflict of target's open merge; the merge applies
// when its last conflict is resolved.
func (c *Client) Resolve(ctx context.Context, target, conflict string, req wire.ResolveRequest) (wire.Merge, error) {
	return send[wire.Merge](ctx, c, http.MethodPost, "/v1/sandboxes/"+seg(target)+"/conflicts/"+seg(conflict)+"/resolve", req)
}

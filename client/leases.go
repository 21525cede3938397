package client

import (
	"context"
	"net/http"

	"github.com/berth-dev/berth/api/wire"
)

// Leases lists the credential leases of sandbox id, or with id "" every
// lease of owner ("" = the key's own; another: admin key).
func (c *Client) Leases(ctx context.Context, owner, id string) ([]wire.Lease, error) {
	path := "/v1/leases"
	if id != "" {
		path = "/v1/sandboxes/" + seg(id) + "/leases"
	}
	l, err := get[wire.LeaseList](ctx, c, path, ownerQuery(owner))
	return l.Leases, err
}

// RevokeLease revokes lease id at once and returns it as revoked.
func (c *Client) RevokeLease(ctx context.Context, id string) (wire.Lease, error) {
	var out wire.Lease
	err := c.Call(ctx, http.MethodDelete, "/v1/leases/"+seg(id), nil, nil, &out)
	return out, err
}

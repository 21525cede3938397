package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/api/wire"
)

// Effects lists the sandbox's side-effect ledger (its own effects and
// those inherited from its fork parent), oldest first; since ("" = all)
// is an RFC 3339 time or a checkpoint (id, name or seq).
func (s *Sandbox) Effects(ctx context.Context, since string) (wire.EffectList, error) {
	var q url.Values
	if since != "" {
		q = url.Values{"since": {since}}
	}
	var out wire.EffectList
	err := s.call(ctx, http.MethodGet, q, nil, &out, "effects")
	return out, err
}

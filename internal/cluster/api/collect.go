package api

import (
	"context"
	"errors"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// collectDeleted removes the objects a node marked deleted (its reaper's
// or its own delete, not a replica's: a replica removes the object itself).
// Nodes may update their sandboxes' objects but not delete them (deploy/'s
// node Role), so the delete of the object and its rows is a replica's.
func (r *Replica) collectDeleted(ctx context.Context) error {
	sbs, _, err := r.cfg.Store.ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{sandbox.Deleted}, Limit: 200})
	if err != nil {
		return err
	}
	var errList []error
	for _, sb := range sbs {
		if err := r.cfg.Store.DeleteSandbox(ctx, sb.ID); err != nil && !errs.Is(err, errs.NotFound) {
			errList = append(errList, err)
			continue
		}
		r.log.Info("sandbox object removed: deleted on its node", "sandbox_id", sb.ID, "node", sb.Attrs.Cluster.Node)
		r.kick() // the room it held may be what a pending sandbox waits for
	}
	return errors.Join(errList...)
}

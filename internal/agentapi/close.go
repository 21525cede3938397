package agentapi

import (
	"context"
	"net/http"
)

// Close drops the client's idle connections to the agent (e.g. before the
// agent is checkpointed or the sandbox is deleted).
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Quiesce asks the agent to close its connections and stop dialing (before a
// checkpoint); the caller then waits for the channel to disconnect.
func (c *Client) Quiesce(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodPost, "/quiesce", nil, nil)
}

package agentapi

// Close drops the client's idle connections to the agent (e.g. before the
// agent is checkpointed or the sandbox is deleted).
func (c *Client) Close() { c.http.CloseIdleConnections() }

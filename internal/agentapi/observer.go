package agentapi

// Observer sees what the daemon asks an agent to do, for the sandbox's
// activity timeline (internal/activity implements it). Every API path that
// runs a process or changes a file — REST exec and files, E2B process and
// filesystem — goes through a Client, so this is the one place they meet.
// Calls run on the request's goroutine and must not block.
type Observer interface {
	// Exec is called when the agent accepted an exec; the ExecObserver
	// sees the stream's events and its end.
	Exec(req ExecRequest) ExecObserver
	// Input counts n bytes written to a process's stdin.
	Input(pid, n int)
	// FileChanged reports a change the agent confirmed: op is write,
	// mkdir, remove or move (to is a move's target).
	FileChanged(op, path, to string, size int64)
}

// ExecObserver sees one exec stream: every event Next returns, then Closed
// (called once or more; the stream may be cut before its exit event).
type ExecObserver interface {
	Event(ev *Event)
	Closed()
}

// SetObserver makes c report to o; call it before c is used.
func (c *Client) SetObserver(o Observer) { c.obs = o }

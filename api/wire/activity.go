package wire

import "time"

// The kinds of ActivityEntry. A client must accept kinds it does not know
// (new ones may be added) and show their Summary.
const (
	ActivityLifecycle = "lifecycle" // a lifecycle event (Data.Event, FromState, ToState, Reason, Message, Attrs)
	ActivityExec      = "exec"      // a process run through the API (Data.Argv ... Pid), one entry when it ends
	ActivityFile      = "file"      // a file change: through the API (Source "api") or sampled in the workspace (Source "workspace")
	ActivityEgress    = "egress"    // an egress decision (Data.Proto, Host, DstIP, DstPort, Verdict, Rule, BytesIn/Out)
	ActivityPause     = "pause"     // the sandbox was paused (Data.Mode actual, Data.Requested)
	ActivityResume    = "resume"    // the sandbox was resumed (Data.ResumedFrom: memory, freeze or disk)
	ActivityReaper    = "reaper"    // a reaper decision (Data.Attrs: its signals, action, policy)
	ActivityDropped   = "dropped"   // the recorder dropped Data.Dropped entries under load (counted, never silent)
)

// ActivityEntry is one entry of a sandbox's activity timeline: GET
// /v1/sandboxes/{id}/activity answers an ActivityList of them, or with
// follow=true an NDJSON stream of them, one per line. Seq increases along
// a sandbox's timeline (it is shared by every sandbox, so it has gaps).
type ActivityEntry struct {
	Seq     int64        `json:"seq"`
	Time    time.Time    `json:"time"`
	Kind    string       `json:"kind"`
	Actor   string       `json:"actor"`
	Summary string       `json:"summary"` // one line for humans
	Data    ActivityData `json:"data"`
}

// ActivityData holds the kind-specific fields of an ActivityEntry; a field
// a kind does not use is left out.
type ActivityData struct {
	// exec
	Argv     []string  `json:"argv,omitempty"`
	User     string    `json:"user,omitempty"` // "" = the agent's default user
	Cwd      string    `json:"cwd,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`
	ExitCode *int      `json:"exit_code,omitempty"` // set when the process exited normally
	Signal   string    `json:"signal,omitempty"`    // set when a signal ended it, e.g. "killed"
	Pid      int       `json:"pid,omitempty"`
	TTY      bool      `json:"tty,omitempty"`
	// Detached: the stream was closed before the process ended (it may
	// still run); Ended is when the stream was closed.
	Detached bool `json:"detached,omitempty"`
	// exec (stdin, output) and egress (to / from the destination)
	BytesIn  int64 `json:"bytes_in,omitempty"`
	BytesOut int64 `json:"bytes_out,omitempty"`

	// file: Op is write, mkdir, remove or move (API) or create, write,
	// remove, rename, chmod (workspace samples); To is a move's target.
	Op     string `json:"op,omitempty"`
	Path   string `json:"path,omitempty"`
	To     string `json:"to,omitempty"`
	Size   int64  `json:"size,omitempty"`
	Source string `json:"source,omitempty"` // "api" or "workspace"
	// More is how many further workspace changes of the same sample window
	// were not listed one by one (the sampler is rate-limited).
	More int64 `json:"more,omitempty"`

	// egress
	Proto      string `json:"proto,omitempty"` // "tcp" or "dns"
	Host       string `json:"host,omitempty"`
	DstIP      string `json:"dst_ip,omitempty"`
	DstPort    int    `json:"dst_port,omitempty"`
	Verdict    string `json:"verdict,omitempty"` // "allow" or "deny"
	Rule       string `json:"rule,omitempty"`
	DurationMs int64  `json:"duration_ms,omitempty"`

	// pause / resume
	Mode         string `json:"mode,omitempty"`      // the mode the pause actually took
	Requested    string `json:"requested,omitempty"` // the mode asked for
	ResumedFrom  string `json:"resumed_from,omitempty"`
	RestoreCount int    `json:"restore_count,omitempty"`

	// lifecycle, pause, resume, reaper: the event behind the entry
	Event     string            `json:"event,omitempty"` // its type: transition, oom, reaper, ...
	FromState State             `json:"from_state,omitempty"`
	ToState   State             `json:"to_state,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	Message   string            `json:"message,omitempty"`
	Attrs     map[string]string `json:"attrs,omitempty"` // the event's data (a reaper decision's signals)

	// dropped
	Dropped int64 `json:"dropped,omitempty"`

	Error string `json:"error,omitempty"`
}

// ActivityList is the body of GET /v1/sandboxes/{id}/activity (without
// follow). Next is the Seq to pass as after= for the following page: the
// last entry's, or the after= that was asked when there are none.
type ActivityList struct {
	Entries []ActivityEntry `json:"entries"`
	Next    int64           `json:"next"`
}

// Package agentapi is the wire contract between the berth daemon and
// berth-agent (PID 1 inside every sandbox). Transport: the daemon listens on
// the unix socket /run/berth/agent.sock inside the sandbox, a READ-ONLY bind
// mount of the host directory sandboxes/<id>/chan/ (which also holds
// env.json); the agent dials it, both sides authenticate with the sandbox's
// key on every connection (handshake.go), and the agent serves plain
// HTTP/1.1 on each: it keeps a few authenticated spares dialed, and the
// daemon takes one per concurrent request (reusing idle ones). A stream
// (exec, attach, watch) occupies one connection. JSON bodies; streams are
// newline-delimited JSON (one Event per line), flushed per event.
//
// Routes (all paths absolute in the sandbox; relative paths resolve against
// the user's home; "~" expands to it):
//
//	GET  /health                         -> 200 Health
//	GET  /activity                       -> 200 Activity
//	POST /exec            ExecRequest    -> 200 NDJSON stream of Event (first is "start")
//	GET  /processes                      -> 200 []ProcessInfo
//	POST /processes/{pid}/attach         -> 200 NDJSON stream of Event (start, then new output only, then exit)
//	POST /processes/{pid}/input  (raw body bytes: stdin, or pty input for a PTY process) -> 204
//	POST /processes/{pid}/close-stdin    -> 204
//	POST /processes/{pid}/signal SignalRequest -> 204
//	POST /processes/{pid}/resize ResizeRequest -> 204
//	GET  /files?path=P&user=U            -> 200 raw bytes (Content-Length set)
//	PUT  /files?path=P&user=U[&mode=0644][&append=1][&metadata=JSON] raw body -> 200 EntryInfo (parents created, owned by user, fsync'd; metadata replaces the file's user.e2b.* xattrs)
//	POST /fs/stat   PathRequest          -> 200 EntryInfo
//	POST /fs/list   ListRequest          -> 200 []EntryInfo
//	POST /fs/mkdir  PathRequest          -> 200 EntryInfo (409 already_exists if it exists)
//	POST /fs/move   MoveRequest          -> 200 EntryInfo (destination)
//	POST /fs/remove PathRequest          -> 204 (missing path is not an error)
//	POST /fs/watch  WatchRequest         -> 200 NDJSON stream of FSEvent (first {"type":"start"})
//	POST /restored  RestoredRequest      -> 204 (host tells the agent it was restored from memory)
//	POST /quiesce                        -> 204, then the agent closes its connections and stops dialing
//
// Errors: non-2xx with Error JSON {"code": "<errs kind name>", "message": "..."}.
// The agent also quiesces on SIGUSR1 and dials again on SIGUSR2 (how a
// restored agent, whose memory says "quiesced", is woken).
package agentapi

import "time"

// SocketDir is where the host's channel directory is mounted (read-only) inside the sandbox.
const SocketDir = "/run/berth"

// SocketName is the agent socket's file name inside SocketDir.
const SocketName = "agent.sock"

// Error is the body of every non-2xx agent response. Code is an errs.Kind name.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type Health struct {
	OK           bool      `json:"ok"`
	Version      string    `json:"version"`
	BootTime     time.Time `json:"boot_time"`
	RestoreCount int       `json:"restore_count"`
}

// Activity feeds the reaper: what happened last inside the sandbox.
type Activity struct {
	LastExec      time.Time `json:"last_exec,omitzero"`
	LastFileWrite time.Time `json:"last_file_write,omitzero"`
	Running       int       `json:"running"`      // live processes started through the agent
	OpenStreams   int       `json:"open_streams"` // exec/attach/watch streams currently open
}

type ExecRequest struct {
	// Argv is the command. If Shell is set, Argv is ignored and the command runs as
	// ["/bin/sh", "-c", Shell] (or bash -l -c when Login is set and /bin/bash exists).
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Login bool              `json:"login,omitempty"`
	Env   map[string]string `json:"env,omitempty"`   // merged over HOME/USER/LOGNAME/PATH defaults
	Cwd   string            `json:"cwd,omitempty"`   // default: user's home
	User  string            `json:"user,omitempty"`  // default: "user" if it exists, else root
	Stdin bool              `json:"stdin,omitempty"` // keep a stdin pipe open (else /dev/null)
	TTY   *TTYSize          `json:"tty,omitempty"`   // run under a PTY of this size
	Tag   string            `json:"tag,omitempty"`
	// TimeoutMs bounds the process lifetime (killed with SIGKILL at expiry); 0 = none.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
}

type TTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Event is one line of an exec/attach stream. Exactly one "start" first and
// exactly one "exit" last (unless the stream is cut). Data is raw bytes
// (base64 in JSON).
type Event struct {
	Type string `json:"type"` // start | stdout | stderr | pty | exit | keepalive | error
	Pid  int    `json:"pid,omitempty"`
	Data []byte `json:"data,omitempty"`
	// exit fields
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"` // e.g. "killed" when terminated by SIGKILL
	Exited   bool   `json:"exited,omitempty"` // true if the process exited normally
	Status   string `json:"status,omitempty"` // os/exec style: "exit status 3", "signal: killed"
	Error    string `json:"error,omitempty"`  // set for type "error" and for timeouts
}

// StreamEvent is an Event as the agent writes it: the exit event of an
// /exec stream also says where the exec's time went inside the sandbox
// (docs/EXEC.md). Event itself stays the wire's ExecEvent; Stream.Next
// keeps Phases aside for the daemon's debug log (Stream.Phases): the
// sandbox's own claim about itself, used for nothing else.
type StreamEvent struct {
	Event
	Phases *ExecPhases `json:"phases,omitempty"`
}

// ExecPhases is one exec inside the sandbox, in µs: Plan from the request's
// arrival until user, cwd and env were resolved; Spawn the PATH lookup and
// fork+exec; Start the start event's write; Run until the wait status came
// (the process's life, its exit and the reap); Drain until its output was
// read to EOF. The exit event then leaves with the end of the answer.
type ExecPhases struct {
	PlanUs  int64 `json:"plan_us"`
	SpawnUs int64 `json:"spawn_us"`
	StartUs int64 `json:"start_us"`
	RunUs   int64 `json:"run_us"`
	DrainUs int64 `json:"drain_us"`
}

type ProcessInfo struct {
	Pid   int               `json:"pid"`
	Tag   string            `json:"tag,omitempty"`
	Argv  []string          `json:"argv"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"`
	TTY   bool              `json:"tty,omitempty"`
	Start time.Time         `json:"start"`
}

type SignalRequest struct {
	Signal int `json:"signal"` // numeric, e.g. 9, 15
}

type ResizeRequest struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

type PathRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
}

type ListRequest struct {
	Path  string `json:"path"`
	Depth int    `json:"depth,omitempty"` // 0 means 1
	User  string `json:"user,omitempty"`
}

type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	User        string `json:"user,omitempty"`
}

type WatchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	User      string `json:"user,omitempty"`
	// IncludeEntry attaches the entry's info to create, write and chmod
	// events (never to remove or rename: the entry is gone).
	IncludeEntry bool `json:"include_entry,omitempty"`
	// AllowNetworkMounts permits watching a directory on a network
	// filesystem (NFS, SMB, FUSE, ...), where changes made elsewhere are
	// not seen; without it such a watch is refused.
	AllowNetworkMounts bool `json:"allow_network_mounts,omitempty"`
}

// EntryInfo describes a file. Type is "file", "dir", "symlink" or "" (unknown/dangling).
// For a symlink, Type is the target's type and SymlinkTarget is set.
type EntryInfo struct {
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Path          string    `json:"path"`
	Size          int64     `json:"size"`
	Mode          uint32    `json:"mode"`        // permission bits only
	Permissions   string    `json:"permissions"` // ls style, e.g. -rw-r--r--
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModTime       time.Time `json:"mod_time"`
	SymlinkTarget string    `json:"symlink_target,omitempty"`
	// Metadata are the file's user.e2b.* xattrs, prefix stripped (metadata.go).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FSEvent is one line of a watch stream.
type FSEvent struct {
	Type  string     `json:"type"`            // start | create | write | remove | rename | chmod | keepalive
	Name  string     `json:"name,omitempty"`  // relative to the watched directory
	Entry *EntryInfo `json:"entry,omitempty"` // with IncludeEntry, when the entry still exists
}

type RestoredRequest struct {
	RestoreCount int       `json:"restore_count"`
	HostTime     time.Time `json:"host_time"`
	// SandboxID is set when the image was restored as a fork: the new
	// sandbox's id, exported as BERTH_SANDBOX_ID from then on (the memory
	// image carries the parent's).
	SandboxID string `json:"sandbox_id,omitempty"`
	// Key (hex) is the fork's own channel key, set with SandboxID: the
	// agent authenticates with it from its next connection on.
	Key string `json:"key,omitempty"`
}

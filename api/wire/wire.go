// Package wire is berth's REST contract: every request and response body of
// the /v1 API, as it travels as JSON. It is what the server encodes and
// decodes, what the CLI, `berth bench` and the public Go client
// (github.com/berth-dev/berth/client) send and read, and what users' own Go
// code may import.
//
// These types are not the domain model: the server converts its internal
// sandbox, snapshot, pool and usage records into them, so a change to how a
// sandbox is stored does not change what the API answers. The package has no
// dependencies beyond the standard library.
//
// api/openapi.yaml describes the same bodies; a test (schema_test.go) checks
// every type here against the document's schemas — property names and
// required fields both ways, and JSON types — so the two cannot drift. A field
// without `omitempty`/`omitzero` is always sent and is "required" in the
// document; a field with it is optional.
package wire

import "time"

// Error is the body of every non-2xx response. Reason is the error kind
// (NotFound, InvalidArgument, ...); Field names the offending input.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	Reason  string `json:"reason"`
}

// Health is the body of GET /v1/health.
type Health struct {
	OK bool `json:"ok"`
}

// State is a sandbox's lifecycle state.
type State string

// The sandbox states.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePausing  State = "pausing"
	StatePaused   State = "paused"
	StateResuming State = "resuming"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
	StateDeleted  State = "deleted"
)

// PauseMode is how a sandbox is paused: freeze, memory or disk.
type PauseMode string

// The pause modes.
const (
	PauseFreeze PauseMode = "freeze"
	PauseMemory PauseMode = "memory"
	PauseDisk   PauseMode = "disk"
)

// ExpiryAction is what happens when a sandbox's TTL runs out.
type ExpiryAction string

// The expiry actions.
const (
	ExpireStop   ExpiryAction = "stop"
	ExpireDelete ExpiryAction = "delete"
	ExpirePause  ExpiryAction = "pause"
)

// Resources are a sandbox's limits.
type Resources struct {
	CPUMillis int   `json:"cpu_millis"` // 1000 = one core
	MemoryMiB int64 `json:"memory_mib"`
	DiskMiB   int64 `json:"disk_mib"`
	Pids      int64 `json:"pids"`
}

// Sandbox is the API view of a sandbox.
type Sandbox struct {
	ID           string            `json:"id"`
	Owner        string            `json:"owner"`
	Template     string            `json:"template"`
	TemplateID   string            `json:"template_id"` // fingerprint of the template used
	Runtime      string            `json:"runtime"`
	State        State             `json:"state"`
	Reason       string            `json:"reason,omitempty"`  // machine reason for the current state
	Message      string            `json:"message,omitempty"` // human text for the current state
	Labels       map[string]string `json:"labels"`
	Env          map[string]string `json:"env,omitempty"`
	Resources    Resources         `json:"resources"`
	CreatedAt    time.Time         `json:"created_at"`
	StartedAt    time.Time         `json:"started_at,omitzero"`
	ExpiresAt    time.Time         `json:"expires_at"`
	ExpiryAction ExpiryAction      `json:"expiry_action"`

	PauseRequested PauseMode `json:"pause_mode_requested,omitempty"`
	PauseActual    PauseMode `json:"pause_mode,omitempty"`
	ResumedFrom    PauseMode `json:"resumed_from,omitempty"`
	RestoreCount   int       `json:"restore_count,omitempty"`
	AutoResume     bool      `json:"auto_resume,omitempty"`

	// Extra carries the server's per-sandbox annotations (network policy,
	// lineage, pool membership, pause timings, ...).
	Extra map[string]string `json:"extra,omitempty"`

	// Tasks is the sandbox's task ledger in brief (GET and resume; absent
	// when it has none).
	Tasks *TaskSummary `json:"tasks,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Template     string            `json:"template,omitempty"`
	Runtime      string            `json:"runtime,omitempty"`
	TTL          string            `json:"ttl,omitempty"`
	ExpiryAction string            `json:"expiry_action,omitempty"`
	CPU          float64           `json:"cpu,omitempty"`
	MemoryMiB    int64             `json:"memory_mib,omitempty"`
	DiskMiB      int64             `json:"disk_mib,omitempty"`
	Pids         int64             `json:"pids,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	AutoResume   bool              `json:"auto_resume,omitempty"`
	Workstation  bool              `json:"workstation,omitempty"`
	Owner        string            `json:"owner,omitempty"` // admin key only
	// Network is the egress policy mode (deny-all | allow-all | rules; "" =
	// server default); Allow/Deny its rules; Secrets the secrets to grant.
	Network string   `json:"network,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
	// Effects are the side-effect ledger's settings (effects.go).
	Effects      *EffectSettings `json:"effects,omitempty"`
	FromSnapshot string          `json:"from_snapshot,omitempty"`
	IdlePolicy   string          `json:"idle_policy,omitempty"` // reaper policy name, or "never"

	// LeaseTTL is how long each lease of a granted secret lives ("": as
	// long as the sandbox; docs/LEASES.md), e.g. 30m.
	LeaseTTL string `json:"lease_ttl,omitempty"`

	// ExpectedDuration is how long the sandbox is expected to live, for
	// cluster placement (docs/CLUSTER.md): a duration (45m, 2h) or a class
	// (short, interactive, long). One host ignores it.
	ExpectedDuration string `json:"expected_duration,omitempty"`
}

// ListResponse is the body of GET /v1/sandboxes; Next is the cursor of the
// following page ("" on the last).
type ListResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	Next      string    `json:"next,omitempty"`
}

// ExtendRequest is the body of POST /v1/sandboxes/{id}/extend.
type ExtendRequest struct {
	TTL string `json:"ttl"`
}

// PauseRequest is the body of POST /v1/sandboxes/{id}/pause; Mode ""
// is the server's default.
type PauseRequest struct {
	Mode PauseMode `json:"mode,omitempty"`
}

// LeaseRequest is the body of POST /v1/sandboxes/{id}/lease; "0" releases.
type LeaseRequest struct {
	For string `json:"for"`
}

// Event is one lifecycle event of a sandbox.
type Event struct {
	Seq       int64             `json:"seq"`
	SandboxID string            `json:"sandbox_id"`
	Owner     string            `json:"owner"`
	Time      time.Time         `json:"time"`
	Actor     string            `json:"actor"`
	Type      string            `json:"type"` // "transition", "oom", "lease", "pause_degraded", ...
	From      State             `json:"from,omitempty"`
	To        State             `json:"to,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	Message   string            `json:"message,omitempty"`
	Data      map[string]string `json:"data,omitempty"`
}

// TTYSize is a terminal size.
type TTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. The answer is an
// NDJSON stream of ExecEvent.
type ExecRequest struct {
	Cmd     []string          `json:"cmd,omitempty"`
	Shell   string            `json:"shell,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	Timeout string            `json:"timeout,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"`
	TTY     *TTYSize          `json:"tty,omitempty"`
	Tag     string            `json:"tag,omitempty"`
}

// The types of ExecEvent.
const (
	ExecStart     = "start"
	ExecStdout    = "stdout"
	ExecStderr    = "stderr"
	ExecPTY       = "pty"
	ExecExit      = "exit"
	ExecKeepalive = "keepalive"
	ExecError     = "error"
)

// ExecEvent is one line of an exec or attach stream: exactly one "start"
// first and one "exit" last (unless the stream is cut). Data is raw bytes
// (base64 in JSON).
type ExecEvent struct {
	Type     string `json:"type"`
	Pid      int    `json:"pid,omitempty"`
	Data     []byte `json:"data,omitempty"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"` // e.g. "killed" when terminated by SIGKILL
	Exited   bool   `json:"exited,omitempty"` // true if the process exited normally
	Status   string `json:"status,omitempty"` // os/exec style: "exit status 3", "signal: killed"
	Error    string `json:"error,omitempty"`  // set for type "error" and for timeouts
}

// ProcessInfo is one process of GET /v1/sandboxes/{id}/processes.
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

// SignalRequest is the body of .../processes/{pid}/signal.
type SignalRequest struct {
	Signal int `json:"signal"` // numeric, e.g. 9, 15
}

// ResizeRequest is the body of .../processes/{pid}/resize.
type ResizeRequest struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// PathRequest is the body of POST /v1/sandboxes/{id}/fs/{stat,mkdir,remove}.
type PathRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
}

// ListRequest is the body of POST /v1/sandboxes/{id}/fs/list.
type ListRequest struct {
	Path  string `json:"path"`
	Depth int    `json:"depth,omitempty"` // 0 means 1
	User  string `json:"user,omitempty"`
}

// MoveRequest is the body of POST /v1/sandboxes/{id}/fs/move.
type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	User        string `json:"user,omitempty"`
}

// EntryInfo describes one file or directory in a sandbox.
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
	// Metadata is the file's user metadata (E2B's, kept as user.e2b.* xattrs).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// RuntimeInfo describes one runtime in GET /v1/info.
type RuntimeInfo struct {
	Name             string `json:"name"`
	Checkpoint       bool   `json:"checkpoint"`
	CheckpointReason string `json:"checkpoint_reason,omitempty"`
	Freeze           bool   `json:"freeze"`
	Default          bool   `json:"default"`
	// Isolation is how the runtime keeps a sandbox from the host:
	// "namespaces+userns+seccomp" or "namespaces+seccomp" (runc), "gVisor" (runsc).
	Isolation string `json:"isolation"`
	// UserNS is the host id range new sandboxes' ids map to (runc).
	UserNS *UserNSInfo `json:"userns,omitempty"`
}

// UserNSInfo is a user namespace mapping: ids 0..size-1 inside are host ids host_id...
type UserNSInfo struct {
	HostID uint32 `json:"host_id"`
	Size   uint32 `json:"size"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version  string        `json:"version"`
	Owner    string        `json:"owner"`
	Admin    bool          `json:"admin"`
	DataDir  string        `json:"data_dir,omitempty"`
	Runtimes []RuntimeInfo `json:"runtimes"`
	CPUs     int           `json:"cpus"`
	Hostname string        `json:"hostname"`
}

// Template is the API view of a template.
type Template struct {
	Name        string            `json:"name"`
	Fingerprint string            `json:"fingerprint,omitempty"`
	Layers      []string          `json:"layers"`
	State       string            `json:"state"`
	Progress    string            `json:"progress,omitempty"`
	Error       string            `json:"error,omitempty"`
	Source      string            `json:"source,omitempty"`
	StartCmd    []string          `json:"start_cmd,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Workdir     string            `json:"workdir,omitempty"`
	User        string            `json:"user,omitempty"`
	Resources   Resources         `json:"resources"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

// TemplateDeleted is the body of DELETE /v1/templates/{name}.
type TemplateDeleted struct {
	Removed         string `json:"removed"`
	LayersCollected int    `json:"layers_collected"`
}

// PullRequest is the body of POST /v1/templates/{name}/pull.
type PullRequest struct {
	Image    string `json:"image"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`
}

// BuildProgress is the progress part of a BuildEvent.
type BuildProgress struct {
	Phase   string `json:"phase"` // download, extract, step, cached, run, output, capture, done
	Message string `json:"message"`
	Bytes   int64  `json:"bytes,omitempty"`
	Step    int    `json:"step,omitempty"`  // 1-based Dockerfile step
	Steps   int    `json:"steps,omitempty"` // number of steps
	Cached  *bool  `json:"cached,omitempty"`
	Output  string `json:"output,omitempty"` // RUN output chunk
}

// BuildEvent is one line of a pull or build stream (application/x-ndjson):
// "progress" lines, then exactly one "result" or "error" line.
type BuildEvent struct {
	Type string `json:"type"` // progress | result | error
	BuildProgress
	Template *Template `json:"template,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// Snapshot is the API view of a snapshot.
type Snapshot struct {
	ID            string            `json:"id"`
	Owner         string            `json:"owner"`
	Name          string            `json:"name,omitempty"`
	SourceSandbox string            `json:"source_sandbox"`
	Template      string            `json:"template"`
	TemplateID    string            `json:"template_id,omitempty"`
	Runtime       string            `json:"runtime"`
	Layers        []string          `json:"layers"`
	Memory        bool              `json:"memory"`
	CreatedAt     time.Time         `json:"created_at"`
	Extra         map[string]string `json:"extra,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// PromoteRequest is the body of POST /v1/snapshots/{id}/template.
type PromoteRequest struct {
	Name string `json:"name"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork; Count nil is 1.
type ForkRequest struct {
	Count *int `json:"count,omitempty"`
}

// ForkResult is the answer to a fork: the snapshot taken and the children.
type ForkResult struct {
	Parent    string    `json:"parent"`
	Snapshot  string    `json:"snapshot"`
	Mode      string    `json:"fork_mode"`
	Reason    string    `json:"reason,omitempty"` // why disk when memory was wanted
	Sandboxes []Sandbox `json:"sandboxes"`
	Millis    int64     `json:"ms"`
}

// PoolRequest is the body of PUT /v1/pools/{template}.
type PoolRequest struct {
	Size      *int    `json:"size"`
	Runtime   string  `json:"runtime,omitempty"`
	CPU       float64 `json:"cpu,omitempty"`
	MemoryMiB int64   `json:"memory_mib,omitempty"`
	DiskMiB   int64   `json:"disk_mib,omitempty"`
	Pids      int64   `json:"pids,omitempty"`
	Auto      bool    `json:"auto,omitempty"`
	Min       int     `json:"min,omitempty"`
	Max       int     `json:"max,omitempty"`
}

// PoolStatus is a warm pool's configuration and how it is doing.
type PoolStatus struct {
	Template  string    `json:"template"`
	Size      int       `json:"size"`
	Runtime   string    `json:"runtime,omitempty"`
	Resources Resources `json:"resources"`
	Auto      bool      `json:"auto,omitempty"`
	Min       int       `json:"min,omitempty"`
	Max       int       `json:"max,omitempty"`

	Fingerprint     string    `json:"fingerprint,omitempty"`
	Target          int       `json:"target"`
	Ready           int       `json:"ready"`
	Starting        int       `json:"starting"`
	Hits            int64     `json:"hits"`
	Misses          int64     `json:"misses"`
	ClaimP50Micros  int64     `json:"claim_p50_us"`
	ClaimP99Micros  int64     `json:"claim_p99_us"`
	IdleMemoryBytes uint64    `json:"idle_memory_bytes"`
	State           string    `json:"state"` // filling | ready | backoff | waiting
	Error           string    `json:"error,omitempty"`
	RetryAt         time.Time `json:"retry_at,omitzero"`
}

// NetworkPolicy is an egress policy. Rules: a CIDR, an IP, a hostname or
// "*.domain", optionally ":PORT".
type NetworkPolicy struct {
	Mode    string          `json:"mode"` // deny-all | allow-all | rules
	Allow   []string        `json:"allow,omitempty"`
	Deny    []string        `json:"deny,omitempty"`
	Effects *EffectSettings `json:"effects,omitempty"`
}

// NetworkRequest is the body of PUT /v1/sandboxes/{id}/net.
type NetworkRequest struct {
	Mode    string          `json:"mode,omitempty"` // deny-all | allow-all | rules; "" = server default
	Allow   []string        `json:"allow,omitempty"`
	Deny    []string        `json:"deny,omitempty"`
	Effects *EffectSettings `json:"effects,omitempty"`
}

// PortInfo is one exposed port as NetworkInfo lists it.
type PortInfo struct {
	Port      int       `json:"port"`
	Token     bool      `json:"token"` // a per-port token also grants access
	CreatedAt time.Time `json:"created_at"`
}

// NetworkInfo is a sandbox's network: its policy, address, secrets, ports.
type NetworkInfo struct {
	SandboxID string        `json:"sandbox_id"`
	Policy    NetworkPolicy `json:"policy"`
	Attached  bool          `json:"attached"`
	IP        string        `json:"ip,omitempty"`
	Secrets   []string      `json:"secrets,omitempty"`
	Ports     []PortInfo    `json:"ports,omitempty"`
}

// EgressEntry is one egress log entry.
type EgressEntry struct {
	Seq         int64     `json:"seq"`
	Time        time.Time `json:"time"`
	Proto       string    `json:"proto"`
	DstIP       string    `json:"dst_ip,omitempty"`
	DstPort     int       `json:"dst_port,omitempty"`
	Host        string    `json:"host,omitempty"`
	Verdict     string    `json:"verdict"`
	Rule        string    `json:"rule"`
	Reason      string    `json:"reason,omitempty"`
	Intercepted bool      `json:"intercepted,omitempty"`
	BytesOut    int64     `json:"bytes_out"`
	BytesIn     int64     `json:"bytes_in"`
	DurationMS  int64     `json:"duration_ms"`
}

// EgressLogResponse is the body of GET /v1/sandboxes/{id}/net/log; Next is
// the after= cursor of the following page.
type EgressLogResponse struct {
	Entries []EgressEntry `json:"entries"`
	Next    int64         `json:"next"`
}

// PortRequest is the body of POST /v1/sandboxes/{id}/ports.
type PortRequest struct {
	Port  int  `json:"port"`
	Token bool `json:"token,omitempty"`
}

// PortResponse says where an exposed port is reachable.
type PortResponse struct {
	PortInfo
	URL         string `json:"url"`
	AccessToken string `json:"access_token,omitempty"` // shown once
}

// PortList is the body of GET /v1/sandboxes/{id}/ports.
type PortList struct {
	Ports []PortResponse `json:"ports"`
}

// SecretRequest is the body of PUT /v1/secrets/{name}.
type SecretRequest struct {
	Host   string `json:"host"`
	Header string `json:"header,omitempty"` // default "Authorization: Bearer {{value}}"
	Value  string `json:"value"`
}

// SecretInfo describes a stored secret (never its value).
type SecretInfo struct {
	Name      string    `json:"name"`
	Host      string    `json:"host"`
	Header    string    `json:"header"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretList is the body of GET /v1/secrets.
type SecretList struct {
	Secrets []SecretInfo `json:"secrets"`
}

// KeyRequest is the body of POST /v1/keys.
type KeyRequest struct {
	Owner string `json:"owner"`
}

// KeyResponse is the answer to POST /v1/keys; the key is shown once.
type KeyResponse struct {
	Owner string `json:"owner"`
	Key   string `json:"key"`
}

// Prices are what usage is priced at.
type Prices struct {
	Currency      string  `json:"currency,omitempty"`
	VCPUHour      float64 `json:"vcpu_hour,omitempty"`
	MemoryGiBHour float64 `json:"memory_gib_hour,omitempty"`
	DiskGiBHour   float64 `json:"disk_gib_hour,omitempty"`
}

// UsageLine is one owner's or one sandbox's metered usage.
type UsageLine struct {
	SandboxID string    `json:"sandbox_id,omitempty"`
	Owner     string    `json:"owner"`
	Template  string    `json:"template,omitempty"`
	State     State     `json:"state,omitempty"`
	Reserved  Resources `json:"reserved,omitzero"`
	Sandboxes int       `json:"sandboxes,omitempty"` // owner lines

	CPUSeconds     float64   `json:"cpu_seconds"`
	MemGiBSeconds  float64   `json:"memory_gib_seconds"`
	MemAvgMiB      float64   `json:"memory_avg_mib"`
	MemPeakMiB     float64   `json:"memory_peak_mib"`
	RunningSeconds float64   `json:"running_seconds"`
	FrozenSeconds  float64   `json:"frozen_seconds"`
	PausedSeconds  float64   `json:"paused_seconds"`
	StoppedSeconds float64   `json:"stopped_seconds"`
	DiskGiBHours   float64   `json:"disk_gib_hours"`
	CostReserved   float64   `json:"cost_reserved"`
	CostActive     float64   `json:"cost_active"`
	LastActiveAt   time.Time `json:"last_active_at,omitzero"`
}

// UsageReport is the body of GET /v1/usage.
type UsageReport struct {
	Since     time.Time   `json:"since,omitzero"`
	Prices    Prices      `json:"prices"`
	Owners    []UsageLine `json:"owners"`
	Sandboxes []UsageLine `json:"sandboxes"`
}

// Orphan is one abandoned sandbox, snapshot or template.
type Orphan struct {
	Kind         string    `json:"kind"` // sandbox, snapshot or template
	ID           string    `json:"id"`
	Owner        string    `json:"owner,omitempty"`
	State        string    `json:"state"`
	Template     string    `json:"template,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	LastActiveAt time.Time `json:"last_active_at,omitzero"`
	AgeDays      float64   `json:"age_days"`
	IdleDays     float64   `json:"idle_days"`
	CostReserved float64   `json:"cost_reserved"`
	CostActive   float64   `json:"cost_active"`
	// Per day from now: reserved basis at its current state; active basis
	// its disk when paused or stopped, else its last 24 hours' rate.
	CostPerDayReserved float64   `json:"cost_per_day_reserved"`
	CostPerDayActive   float64   `json:"cost_per_day_active"`
	Reserved           Resources `json:"reserved,omitzero"`
}

// OrphanReport is the body of GET /v1/reports/orphans.
type OrphanReport struct {
	Days  int      `json:"days"`
	Items []Orphan `json:"items"`
}

// QuotaLimits are an owner's limits (0 = unlimited); the body of
// PUT /v1/quotas/{owner}.
type QuotaLimits struct {
	Sandboxes int     `json:"sandboxes,omitempty"` // concurrent sandboxes
	CPU       float64 `json:"cpu,omitempty"`       // total vCPU of those sandboxes
	MemoryMiB int64   `json:"memory_mib,omitempty"`
	DiskMiB   int64   `json:"disk_mib,omitempty"`
	Snapshots int     `json:"snapshots,omitempty"`
}

// QuotaUse is what an owner uses of its limits.
type QuotaUse struct {
	Sandboxes int     `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskMiB   int64   `json:"disk_mib"`
	Snapshots int     `json:"snapshots"`
}

// QuotaInfo is an owner's limits, where they come from and its use.
type QuotaInfo struct {
	Owner  string      `json:"owner"`
	Source string      `json:"source"` // stored | config | none
	Limits QuotaLimits `json:"limits"`
	Use    QuotaUse    `json:"use"`
}

// PoolOwner owns the warm pools' ready members until one is claimed: the
// admin key lists them with ?owner=_pool.
const PoolOwner = "_pool"

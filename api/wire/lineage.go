package wire

// Diff and compare of sandboxes of one lineage (docs/FORK-MERGE.md §2–3,
// docs/API.md "Diff and compare").

// DiffNode is one object of a tree as a diff reports it.
type DiffNode struct {
	Type   string `json:"type"` // file, dir, symlink, char, block, fifo, socket
	Mode   uint32 `json:"mode"` // permission bits plus setuid/setgid/sticky (07777)
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Size   int64  `json:"size,omitempty"`
	Target string `json:"target,omitempty"` // a symlink's target (never followed)
	SHA256 string `json:"sha256,omitempty"`
}

// DiffChange is one path that differs.
type DiffChange struct {
	Path           string    `json:"path"`
	Kind           string    `json:"kind"` // added, deleted, modified
	Old            *DiffNode `json:"old,omitempty"`
	New            *DiffNode `json:"new,omitempty"`
	ContentChanged bool      `json:"content_changed,omitempty"`
	ModeChanged    bool      `json:"mode_changed,omitempty"`
	OwnerChanged   bool      `json:"owner_changed,omitempty"`
	TypeChanged    bool      `json:"type_changed,omitempty"`
	Binary         bool      `json:"binary,omitempty"`
	Refused        string    `json:"refused,omitempty"` // why the object was not examined (a device node)
	RenamedFrom    string    `json:"renamed_from,omitempty"`
	RenamedTo      string    `json:"renamed_to,omitempty"`
	LinesAdded     int       `json:"lines_added,omitempty"`
	LinesRemoved   int       `json:"lines_removed,omitempty"`
	Unified        string    `json:"unified,omitempty"`
	TextOmitted    string    `json:"text_omitted,omitempty"`
}

// DiffStat sums a diff up.
type DiffStat struct {
	Files        int `json:"files"`
	Added        int `json:"added"`
	Deleted      int `json:"deleted"`
	Modified     int `json:"modified"`
	LinesAdded   int `json:"lines_added"`
	LinesRemoved int `json:"lines_removed"`
}

// DiffResult answers GET /v1/sandboxes/{id}/diff: the changes in path order.
type DiffResult struct {
	Changes []DiffChange `json:"changes"`
	Stat    DiffStat     `json:"stat"`
}

// CompareRequest asks POST /v1/sandboxes/{id}/compare to compare the
// sandbox's children.
type CompareRequest struct {
	// Check is a shell command run in every child (sh -c), e.g. "pytest -q".
	Check string `json:"check,omitempty"`
	// Timeout bounds each check ("10m", "90s"); default 10m.
	Timeout string `json:"timeout,omitempty"`
}

// CompareCheck is a child's check run.
type CompareCheck struct {
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Ms         int64  `json:"ms"`
	OutputTail string `json:"output_tail"` // the last 4 KiB of stdout and stderr
	Error      string `json:"error,omitempty"`
}

// CompareCost is a child's metered usage since it was created.
type CompareCost struct {
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	RunningSeconds   float64 `json:"running_seconds"`
	CostActive       float64 `json:"cost_active"`   // active CPU + memory + disk held (GET /v1/usage)
	CostReserved     float64 `json:"cost_reserved"` // wall-clock × reserved size
}

// CompareChild is one child of the compared sandbox.
type CompareChild struct {
	ID    string        `json:"id"`
	State string        `json:"state"`
	Stat  *DiffStat     `json:"stat,omitempty"` // its changes since the fork point
	Check *CompareCheck `json:"check,omitempty"`
	Cost  *CompareCost  `json:"cost,omitempty"`
	Error string        `json:"error,omitempty"` // why the stat or check is missing
}

// CompareResult answers POST /v1/sandboxes/{id}/compare: children sorted
// passing first (check exit 0), then by diff size.
type CompareResult struct {
	Parent   string         `json:"parent"`
	Children []CompareChild `json:"children"`
}

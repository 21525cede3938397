package wire

import "time"

// MergeRequest is the body of POST /v1/sandboxes/{id}/merges: merge the
// fork Source into the sandbox {id} (the target) against their fork point.
type MergeRequest struct {
	Source string `json:"source"`
	// Strategy is three-way (default: conflicts are stored), ours or theirs
	// (conflicts settled for that side).
	Strategy string `json:"strategy,omitempty"`
	// Paths limits the merge to these path prefixes or path.Match patterns.
	Paths []string `json:"paths,omitempty"`
}

// Merge is one merge into a target. State is planned, conflicted,
// applied or aborted; Conflicts counts the unresolved ones.
type Merge struct {
	ID        string     `json:"id"`
	Target    string     `json:"target"`
	Source    string     `json:"source"`
	Base      string     `json:"base"`
	Strategy  string     `json:"strategy"`
	State     string     `json:"state"`
	Writes    int        `json:"writes"`
	Deletes   int        `json:"deletes"`
	Conflicts int        `json:"conflicts"`
	OpenFiles []OpenFile `json:"open_files"`
	Ms        int64      `json:"ms"`
	// PhasesMs is where Ms went, by phase (docs/MERGES.md): capture, plan,
	// store, prepare, journal, stage, freeze, verify, commit, finish.
	PhasesMs  map[string]float64 `json:"phases_ms,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	CreatedAt time.Time          `json:"created_at"`
}

// OpenFile is a running process of the target that has a path the merge
// changed open (memory is not merged: the process keeps the old file).
type OpenFile struct {
	PID  int    `json:"pid"`
	Cmd  string `json:"cmd"`
	Path string `json:"path"`
}

// ConflictVersion is one side's object at a conflicting path: Node is
// absent where that side has none; Text is a text file's content.
type ConflictVersion struct {
	Node *DiffNode `json:"node,omitempty"`
	Text []byte    `json:"text,omitempty"`
}

// Conflict is a stored conflict of an open merge (GET
// /v1/sandboxes/{id}/conflicts answers a list of them); ID is stable for the
// same inputs. Merged is the line merge with conflict markers.
type Conflict struct {
	ID      string          `json:"id"`
	Path    string          `json:"path"`
	Kind    string          `json:"kind"`
	Message string          `json:"message"`
	Base    ConflictVersion `json:"base"`
	Ours    ConflictVersion `json:"ours"`
	Theirs  ConflictVersion `json:"theirs"`
	Merged  []byte          `json:"merged,omitempty"`
}

// ResolveRequest is the body of POST /v1/sandboxes/{id}/conflicts/{cid}/resolve:
// a side (ours, theirs, base) or the content (base64 in JSON) the path
// becomes, with an optional mode.
type ResolveRequest struct {
	Side    string  `json:"side,omitempty"`
	Content []byte  `json:"content,omitempty"`
	Mode    *uint32 `json:"mode,omitempty"`
}

package wire

import "time"

// NoteRequest is the body of POST /v1/sandboxes/{id}/note: what the agent
// (or its operator) supplies; each field at most 4 KiB.
type NoteRequest struct {
	Reason         string `json:"reason,omitempty"`
	Unfinished     string `json:"unfinished,omitempty"`
	Next           string `json:"next,omitempty"`
	ContextVersion string `json:"context_version,omitempty"`
}

// Note is one handoff note (docs/NOTES.md).
type Note struct {
	SandboxID      string        `json:"sandbox_id"`
	Seq            int64         `json:"seq"`
	Trigger        string        `json:"trigger"` // pause | stop | demand | fork | restore
	Actor          string        `json:"actor,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
	Reason         string        `json:"reason,omitempty"`
	Unfinished     string        `json:"unfinished,omitempty"`
	Next           string        `json:"next,omitempty"`
	ContextVersion string        `json:"context_version,omitempty"`
	Collected      bool          `json:"collected"`
	Files          NoteFiles     `json:"files"`
	Repos          []NoteRepo    `json:"repos,omitempty"`
	ReposTotal     int           `json:"repos_total,omitempty"`
	GitError       string        `json:"git_error,omitempty"`
	Processes      []NoteProcess `json:"processes,omitempty"`
	ProcessesError string        `json:"processes_error,omitempty"`
	InheritedFrom  *NoteRef      `json:"inherited_from,omitempty"`
	RestoredFrom   *NoteRef      `json:"restored_from,omitempty"`
	Desync         *Desync       `json:"desync,omitempty"`
	Warnings       []string      `json:"warnings,omitempty"`
	Millis         int64         `json:"ms"`
}

// NoteRef names another sandbox's (or an older) note.
type NoteRef struct {
	SandboxID string `json:"sandbox_id"`
	Seq       int64  `json:"seq"`
}

// NoteFiles is what changed in the workspace since note SinceSeq (0 = since the template).
type NoteFiles struct {
	Changes   []NoteFileChange `json:"changes,omitempty"`
	Total     int              `json:"total"`
	Added     int              `json:"added"`
	Modified  int              `json:"modified"`
	Deleted   int              `json:"deleted"`
	SinceSeq  int64            `json:"since_seq"`
	Truncated bool             `json:"truncated,omitempty"`
	Error     string           `json:"error,omitempty"`
}

// NoteFileChange is one changed path.
type NoteFileChange struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"` // added | modified | deleted
	Type    string `json:"type,omitempty"`
	Size    int64  `json:"size"`
	OldSize int64  `json:"old_size,omitempty"`
}

// NoteRepo is one git repository's state as the sandbox's git answered.
type NoteRepo struct {
	Path          string   `json:"path"`
	Branch        string   `json:"branch,omitempty"`
	Head          string   `json:"head,omitempty"`
	Dirty         []string `json:"dirty,omitempty"`
	DirtyTotal    int      `json:"dirty_total"`
	Unpushed      []string `json:"unpushed,omitempty"`
	UnpushedTotal int      `json:"unpushed_total"`
	Error         string   `json:"error,omitempty"`
}

// NoteProcess is one process the agent was running.
type NoteProcess struct {
	Pid   int       `json:"pid"`
	Tag   string    `json:"tag,omitempty"`
	Argv  []string  `json:"argv"`
	Cwd   string    `json:"cwd,omitempty"`
	User  string    `json:"user,omitempty"`
	Start time.Time `json:"start"`
}

// Desync says the agent's declared model-context version is newer than
// the machine state (the machine was rolled back, or resumed, under it).
type Desync struct {
	AgentVersion   string `json:"agent_version"`
	MachineVersion string `json:"machine_version"`
	Message        string `json:"message"`
}

// CurrentNote is the answer of GET /v1/sandboxes/{id}/note: the newest
// note (absent before the first) and the desync of the sandbox now.
type CurrentNote struct {
	Note   *Note   `json:"note,omitempty"`
	Desync *Desync `json:"desync,omitempty"`
}

// NoteList is the answer of GET /v1/sandboxes/{id}/notes, newest first.
type NoteList struct {
	Notes []Note `json:"notes"`
}

// ResumeResult is the answer of POST /v1/sandboxes/{id}/resume: the
// sandbox, plus its newest handoff note and desync (a client that reads a
// plain Sandbox ignores them).
type ResumeResult struct {
	Sandbox
	Note   *Note   `json:"note,omitempty"`
	Desync *Desync `json:"desync,omitempty"`
}

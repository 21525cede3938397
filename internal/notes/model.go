package notes

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/errs"
)

// Bounds (issue 17): what a note may hold. Everything a sandbox can
// write or say is hostile, so each is enforced where the text enters.
const (
	MaxField      = 4 << 10 // bytes of one agent-supplied field
	MaxFiles      = 200     // file changes listed per note (Files.Total counts all)
	MaxRepos      = 20      // git repositories reported per note
	MaxRepoLines  = 50      // dirty files and unpushed commits listed per repository
	MaxLine       = 512     // bytes of one line of git's answer
	MaxGitOutput  = 256 << 10
	MaxProcesses  = 64
	MaxArgv       = 32  // argv entries kept per process
	MaxArg        = 256 // bytes of one argv entry
	Retained      = 100 // notes kept per sandbox
	keptManifests = 10  // newest notes that keep their file manifest
	// manifestEntries bounds the paths of one manifest (the walk of the
	// sandbox's own layers stops there, and says so).
	manifestEntries = 20000
	// hashMax / hashBudget: a regular file up to hashMax is hashed so an
	// in-place edit of the same size is seen; at most hashBudget bytes per note.
	hashMax    = 1 << 20
	hashBudget = 32 << 20
	// Budget bounds how long a note's collection may take (a pause or a
	// stop waits for it at most this long).
	Budget = 2 * time.Second
)

// Triggers: why a note was written.
const (
	TriggerPause   = "pause"
	TriggerStop    = "stop"
	TriggerDemand  = "demand"
	TriggerFork    = "fork"
	TriggerRestore = "restore"
)

// Supplied is what the agent (or its operator) says: why it stopped, what
// is unfinished, the next step and the version id of its model context.
type Supplied struct {
	Reason         string `json:"reason,omitempty"`
	Unfinished     string `json:"unfinished,omitempty"`
	Next           string `json:"next,omitempty"`
	ContextVersion string `json:"context_version,omitempty"`
}

// Validate enforces the bounds of agent-supplied text (the field named).
func (s Supplied) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"reason", s.Reason}, {"unfinished", s.Unfinished}, {"next", s.Next}, {"context_version", s.ContextVersion},
	} {
		if len(f.v) > MaxField {
			return errs.Field(f.name, "is %d bytes, at most %d allowed", len(f.v), MaxField)
		}
		if !utf8.ValidString(f.v) {
			return errs.Field(f.name, "must be UTF-8 text")
		}
	}
	if strings.ContainsAny(s.ContextVersion, "\n\r") {
		return errs.Field("context_version", "must be one line")
	}
	return nil
}

// Note is one handoff note.
type Note struct {
	Sandbox   string    `json:"sandbox_id"`
	Seq       int64     `json:"seq"`
	Trigger   string    `json:"trigger"`
	Actor     string    `json:"actor,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Supplied
	// ContextVersion (in Supplied) is the latest the agent declared: an
	// automatic note carries the previous note's forward.

	// Collected says the machine state below was read from the running
	// sandbox for this note (false: the sandbox was not running, or the
	// note is a copy — see Inherited and RestoredFrom).
	Collected  bool      `json:"collected"`
	Files      Files     `json:"files"`
	Repos      []Repo    `json:"repos,omitempty"`
	ReposTotal int       `json:"repos_total,omitempty"`
	GitError   string    `json:"git_error,omitempty"`
	Processes  []Process `json:"processes,omitempty"`
	ProcError  string    `json:"processes_error,omitempty"`
	Inherited  *Ref      `json:"inherited_from,omitempty"`
	Restored   *Ref      `json:"restored_from,omitempty"`
	Desync     *Desync   `json:"desync,omitempty"`
	Warnings   []string  `json:"warnings,omitempty"`
	Millis     int64     `json:"ms"`
}

// Ref names another note (of a fork parent, or of a restored point).
type Ref struct {
	Sandbox string `json:"sandbox_id"`
	Seq     int64  `json:"seq"`
}

// Files is what changed in the workspace since the previous note's
// manifest (SinceSeq; 0 = since the template: the first note, or after
// the previous manifests were pruned).
type Files struct {
	Changes   []FileChange `json:"changes,omitempty"`
	Total     int          `json:"total"`
	Added     int          `json:"added"`
	Modified  int          `json:"modified"`
	Deleted   int          `json:"deleted"`
	SinceSeq  int64        `json:"since_seq"`
	Truncated bool         `json:"truncated,omitempty"` // the walk hit its bound: changes beyond it are not counted
	Error     string       `json:"error,omitempty"`
}

// FileChange is one path that changed between two notes.
type FileChange struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"` // added | modified | deleted
	Type    string `json:"type,omitempty"`
	Size    int64  `json:"size"`
	OldSize int64  `json:"old_size,omitempty"`
}

// Repo is the git state of one repository of the workspace, as the
// sandbox's own git answered (hostile text: bounded, one line each).
type Repo struct {
	Path          string   `json:"path"`
	Branch        string   `json:"branch,omitempty"`
	Head          string   `json:"head,omitempty"`
	Dirty         []string `json:"dirty,omitempty"`
	DirtyTotal    int      `json:"dirty_total"`
	Unpushed      []string `json:"unpushed,omitempty"`
	UnpushedTotal int      `json:"unpushed_total"`
	Error         string   `json:"error,omitempty"`
}

// Process is one process the agent was running.
type Process struct {
	Pid   int       `json:"pid"`
	Tag   string    `json:"tag,omitempty"`
	Argv  []string  `json:"argv"`
	Cwd   string    `json:"cwd,omitempty"`
	User  string    `json:"user,omitempty"`
	Start time.Time `json:"start"`
}

// Desync says the agent's declared model-context version is newer than
// the machine state it now runs on (the machine was rolled back under it).
type Desync struct {
	AgentVersion   string `json:"agent_version"`
	MachineVersion string `json:"machine_version"`
	Message        string `json:"message"`
}

// clip bounds hostile text to n bytes of valid UTF-8 without control
// characters (tabs become spaces).
func clip(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	s = strings.ToValidUTF8(s, "?")
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t':
			return ' '
		case r < 0x20 || r == 0x7f:
			return -1
		}
		return r
	}, s)
}

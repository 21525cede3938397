package wire

import "time"

// CheckpointRequest is the body of POST /v1/sandboxes/{id}/checkpoints.
type CheckpointRequest struct {
	Name   string `json:"name,omitempty"`
	Memory bool   `json:"memory,omitempty"` // a memory image too, where the runtime can take one
}

// Checkpoint is one point on a sandbox's timeline.
type Checkpoint struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Seq     int64     `json:"seq"`
	Name    string    `json:"name,omitempty"`
	Layer   string    `json:"layer"`  // the delta layer: only what changed since Prev
	Layers  []string  `json:"layers"` // the checkpoint's view, top first
	Prev    string    `json:"prev,omitempty"`
	Runtime string    `json:"runtime"`
	Mode    string    `json:"mode"`             // memory | files
	Reason  string    `json:"reason,omitempty"` // why files when memory was asked for
	Bytes   int64     `json:"bytes"`            // bytes of regular files in the delta
	Entries int64     `json:"entries"`          // entries of the delta layer
	Head    bool      `json:"head"`             // the sandbox's next checkpoint is a delta against this one
	Created time.Time `json:"created_at"`
}

// Timeline is the answer to GET /v1/sandboxes/{id}/checkpoints.
type Timeline struct {
	Sandbox     string       `json:"sandbox"`
	Head        string       `json:"head,omitempty"`
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// RewindRequest is the body of POST /v1/sandboxes/{id}/rewind: To is a
// checkpoint's id, name or seq.
type RewindRequest struct {
	To string `json:"to"`
}

// RewindResult is the answer to a rewind.
type RewindResult struct {
	Sandbox    Sandbox    `json:"sandbox"`
	Checkpoint Checkpoint `json:"checkpoint"`
	Mode       string     `json:"mode"` // memory | files
	Reason     string     `json:"reason,omitempty"`
	Millis     int64      `json:"ms"`
	// TaskRollback is the task ledger's warning: the steps the rewind
	// rolled back (absent when the ledger is empty).
	TaskRollback *TaskRollback `json:"task_rollback,omitempty"`
	// Note is the sandbox's handoff note now: the note of the restored
	// point, with a desync warning (Desync when the agent's declared
	// context version is newer than the point's).
	Note   *Note   `json:"note,omitempty"`
	Desync *Desync `json:"desync,omitempty"`
	// EffectsAfter are the outside effects the sandbox made after the
	// checkpoint: the rewound state does not know of them; they stay in
	// the ledger (a retry is answered from it, docs/EFFECTS.md).
	EffectsAfter []Effect `json:"effects_after"`
}

// PromoteChildRequest is the body of POST /v1/sandboxes/{id}/promote ({id}
// is the fork child whose state its parent takes).
type PromoteChildRequest struct {
	DiscardOthers bool `json:"discard_others,omitempty"`
}

// PromoteChildResult is the answer to a promote.
type PromoteChildResult struct {
	Parent    Sandbox  `json:"parent"`
	From      string   `json:"from"`
	Layer     string   `json:"layer"`
	Mode      string   `json:"mode"` // memory | files
	Reason    string   `json:"reason,omitempty"`
	Discarded []string `json:"discarded"`
	Millis    int64    `json:"ms"`
}

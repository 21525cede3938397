package wire

import "time"

// AuditEntry is one link of the audit chain (docs/AUDIT.md): GET /v1/audit
// answers an AuditList of them; `berth audit export` writes them as JSON
// lines. Hash = hex(SHA-256(bytes of PrevHash ‖ the entry's canonical
// encoding)); an outside verifier can recompute every link from an export
// (the MAC needs the server's key and is checked by POST /v1/audit/verify).
type AuditEntry struct {
	Seq      int64             `json:"seq"`
	Time     time.Time         `json:"time"`
	Actor    string            `json:"actor"`  // an owner (API key), "sandbox:<id>" (in-sandbox API, egress), "api" (an exec's command line), "berth"
	Action   string            `json:"action"` // "api", "exec", "sandbox.paused", "egress.deny", "task.approve", ...
	Sandbox  string            `json:"sandbox,omitempty"`
	Owner    string            `json:"owner,omitempty"`
	Data     map[string]string `json:"data,omitempty"`
	PrevHash string            `json:"prev_hash"`
	Hash     string            `json:"hash"`
}

// AuditList is one page of the chain, oldest first. Next is the after=
// cursor of the next page (0 on the last page).
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
	Next    int64        `json:"next,omitempty"`
}

// AuditReport is the answer of POST /v1/audit/verify (admin).
type AuditReport struct {
	OK       bool           `json:"ok"`
	Entries  int64          `json:"entries"`
	LastSeq  int64          `json:"last_seq"`
	LastHash string         `json:"last_hash,omitempty"`
	HeadSeq  int64          `json:"head_seq"`           // the store's head
	FileSeq  int64          `json:"file_seq,omitempty"` // the head file's
	Problems []AuditProblem `json:"problems,omitempty"` // the first 100
	Total    int            `json:"total_problems,omitempty"`
}

// AuditProblem is one finding of verify. Kind: changed, removed,
// reordered, truncated, head, recorded.
type AuditProblem struct {
	Seq     int64  `json:"seq"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

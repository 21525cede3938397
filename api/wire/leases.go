package wire

import "time"

// Lease states.
const (
	LeaseActive  = "active"
	LeaseFrozen  = "frozen"
	LeaseRevoked = "revoked"
)

// Lease is a secret issued to one generation of a sandbox (docs/LEASES.md):
// inside, env var Secret holds Placeholder; the egress proxy injects the
// secret on requests to Host only while the lease is active.
type Lease struct {
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox_id"`
	Generation  int       `json:"generation"`
	Secret      string    `json:"secret"`
	Host        string    `json:"host"`
	Header      string    `json:"header"`
	Placeholder string    `json:"placeholder"`
	IssuedAt    time.Time `json:"issued_at"`
	// ExpiresAt is the lease's own expiry; absent: it lives as long as
	// the sandbox (SandboxExpiry).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	State     string     `json:"state"`  // active | frozen | revoked
	Reason    string     `json:"reason"` // why it was last changed: issued, paused, resumed, restored, revoked, expired
	ChangedAt time.Time  `json:"changed_at"`
}

// LeaseList is the answer to GET /v1/leases and GET /v1/sandboxes/{id}/leases.
type LeaseList struct {
	Leases []Lease `json:"leases"`
}

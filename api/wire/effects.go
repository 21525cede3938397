package wire

import "time"

// EffectSettings are a network policy's side-effect settings (docs/EFFECTS.md):
// the hosts whose non-GET/HEAD/OPTIONS requests the ledger records (every
// request carrying an injected secret is recorded anyway), whether berth
// derives an Idempotency-Key where the agent set none, and what a repeat of
// a completed effect by a fork or a restored sandbox gets.
type EffectSettings struct {
	Effectful   []string `json:"effectful,omitempty"`   // hostnames or *.domain, optionally :PORT
	Idempotency string   `json:"idempotency,omitempty"` // keep (default) | derive
	Repeat      string   `json:"repeat,omitempty"`      // replay (default) | refuse
}

// Effect is one side effect in a sandbox's ledger.
type Effect struct {
	ID        string `json:"id"`
	Sandbox   string `json:"sandbox"` // the sandbox that made it
	Lineage   string `json:"lineage"` // the lineage root
	Inherited bool   `json:"inherited"`
	Step      string `json:"step,omitempty"`
	Method    string `json:"method"`
	Host      string `json:"host"`
	Path      string `json:"path"`
	// BodySHA256 is the hex SHA-256 of the request body, BodySize its bytes.
	BodySHA256     string    `json:"body_sha256"`
	BodySize       int64     `json:"body_size"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	KeySource      string    `json:"key_source,omitempty"` // agent | derived
	Secret         bool      `json:"secret"`               // carried an injected secret
	State          string    `json:"state"`                // pending | completed | unknown | withdrawn
	Status         int       `json:"status,omitempty"`     // the upstream's HTTP status
	ResponseSize   int64     `json:"response_size"`
	Replayable     bool      `json:"replayable"` // a repeat is answered from the ledger
	Reason         string    `json:"reason,omitempty"`
	StartedAt      time.Time `json:"started_at"`
	EndedAt        time.Time `json:"ended_at,omitzero"`
}

// EffectList is the answer to GET /v1/sandboxes/{id}/effects.
type EffectList struct {
	Sandbox string   `json:"sandbox"`
	Since   string   `json:"since,omitempty"` // the bound asked for (time or checkpoint)
	Effects []Effect `json:"effects"`
}

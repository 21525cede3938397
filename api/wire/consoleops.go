package wire

import "time"

// UsageSeries is the body of GET /v1/usage/series: cost per bucket per
// owner or template, on both bases. Buckets are the buckets' start times;
// every line has one value per bucket.
type UsageSeries struct {
	By          string       `json:"by"` // owner | template
	StepSeconds int64        `json:"step_seconds"`
	From        time.Time    `json:"from"`
	To          time.Time    `json:"to"`
	Prices      Prices       `json:"prices"`
	Buckets     []time.Time  `json:"buckets"`
	Lines       []SeriesLine `json:"lines"`
}

// SeriesLine is one owner's or template's cost per bucket.
type SeriesLine struct {
	Key           string    `json:"key"`
	Reserved      []float64 `json:"reserved"`
	Active        []float64 `json:"active"`
	TotalReserved float64   `json:"total_reserved"`
	TotalActive   float64   `json:"total_active"`
}

// OrphanCleanupRequest is the body of POST /v1/reports/orphans/cleanup:
// what to delete, each only if it is still an orphan of the report with
// the same Days (nil = 7) when the request arrives.
type OrphanCleanupRequest struct {
	Days      *int     `json:"days,omitempty"`
	Sandboxes []string `json:"sandboxes,omitempty"`
	Snapshots []string `json:"snapshots,omitempty"`
}

// OrphanRef names one sandbox or snapshot.
type OrphanRef struct {
	Kind string `json:"kind"` // sandbox | snapshot
	ID   string `json:"id"`
}

// OrphanRefusal is one item a clean-up left alone, and why.
type OrphanRefusal struct {
	Kind  string `json:"kind"`
	ID    string `json:"id"`
	Error Error  `json:"error"`
}

// OrphanCleanupResult says what a clean-up deleted and what it refused.
type OrphanCleanupResult struct {
	Deleted []OrphanRef     `json:"deleted"`
	Refused []OrphanRefusal `json:"refused"`
}

// TemplateBuild is one finished import, pull or Dockerfile build.
type TemplateBuild struct {
	Seq         int64     `json:"seq"`
	Template    string    `json:"template"`
	Kind        string    `json:"kind"` // import | pull | build
	Source      string    `json:"source,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	EndedAt     time.Time `json:"ended_at"`
	Millis      int64     `json:"ms"`
	Result      string    `json:"result"` // ready | failed
	Fingerprint string    `json:"fingerprint,omitempty"`
	Layers      int       `json:"layers"`
	Error       string    `json:"error,omitempty"`
}

// TemplateBuildList is the body of GET /v1/builds.
type TemplateBuildList struct {
	Builds []TemplateBuild `json:"builds"`
}

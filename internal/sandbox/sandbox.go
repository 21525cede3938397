package sandbox

import (
	"crypto/rand"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// ExpiryAction is what happens when a sandbox reaches its expiry.
type ExpiryAction string

const (
	ExpireStop   ExpiryAction = "stop"
	ExpireDelete ExpiryAction = "delete"
	ExpirePause  ExpiryAction = "pause"
)

// PauseMode is how a sandbox is suspended.
type PauseMode string

const (
	PauseFreeze PauseMode = "freeze"
	PauseMemory PauseMode = "memory"
	PauseDisk   PauseMode = "disk"
)

// Resources are the limits a sandbox runs under.
type Resources struct {
	CPUMillis int   `json:"cpu_millis"` // 1000 = one core
	MemoryMiB int64 `json:"memory_mib"`
	DiskMiB   int64 `json:"disk_mib"`
	Pids      int64 `json:"pids"`
}

// Sandbox is one isolated instance as stored.
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
	// AccessTokenHash is the hex SHA-256 of the per-sandbox envd token
	// (E2B); the token itself is never stored (daemon.EnvdToken derives it).
	AccessTokenHash string `json:"-"`
	// Pause bookkeeping (filled by the pause feature).
	PauseRequested PauseMode `json:"pause_mode_requested,omitempty"`
	PauseActual    PauseMode `json:"pause_mode,omitempty"`
	ResumedFrom    PauseMode `json:"resumed_from,omitempty"`
	RestoreCount   int       `json:"restore_count,omitempty"`
	AutoResume     bool      `json:"auto_resume,omitempty"`
	// Attrs are the features' typed state (lineage, layers, pool, network...).
	// The store keeps them as one JSON column; the REST answer (api/wire)
	// shows them as the legacy "extra" map (LegacyExtra).
	Attrs `json:"-"`
	// Version increases on every write (optimistic concurrency in the store).
	Version int64 `json:"-"`
}

// Event is an append-only record of a lifecycle change.
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

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a fresh sandbox id: 20 chars of [a-z0-9], starting with a
// letter (E2B routes by "<port>-<id>" host labels, so no '-' ever).
func NewID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = idAlphabet[int(c)%len(idAlphabet)]
	}
	out[0] = idAlphabet[int(b[0])%26]
	return string(out)
}

var idRe = lazyregexp.New(`^[a-z0-9]{1,64}$`)

// ValidID reports whether s is syntactically a sandbox id.
func ValidID(s string) bool { return idRe.MatchString(s) }

// ValidateLabels checks label keys and values; the error names the field.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > 64 {
		return errs.Field(field, "at most 64 entries allowed, got %d", len(labels))
	}
	// Keys are free text (E2B metadata keys may hold spaces) but never '='
	// (filters are written key=value) nor control characters.
	for k, v := range labels {
		if k == "" || len(k) > 128 || strings.Contains(k, "=") || hasControl(k) || !utf8.ValidString(k) {
			return errs.Field(field, "key %q must be 1-128 bytes of printable UTF-8 without '='", k)
		}
		if len(v) > 1024 || hasControl(v) || !utf8.ValidString(v) {
			return errs.Field(field, "value of %q must be at most 1024 bytes of printable UTF-8", k)
		}
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// ValidateResources checks limits against server maxima; zero fields mean "use default".
func ValidateResources(r Resources, max Resources) error {
	if r.CPUMillis < 0 || (max.CPUMillis > 0 && r.CPUMillis > max.CPUMillis) {
		return errs.Field("cpu", "must be between 0.01 and %g cores", float64(max.CPUMillis)/1000)
	}
	if r.CPUMillis != 0 && r.CPUMillis < 10 {
		return errs.Field("cpu", "must be at least 0.01 cores")
	}
	if r.MemoryMiB < 0 || (r.MemoryMiB != 0 && r.MemoryMiB < 16) || (max.MemoryMiB > 0 && r.MemoryMiB > max.MemoryMiB) {
		return errs.Field("memory", "must be between 16 and %d MiB", max.MemoryMiB)
	}
	if r.DiskMiB < 0 || (r.DiskMiB != 0 && r.DiskMiB < 16) || (max.DiskMiB > 0 && r.DiskMiB > max.DiskMiB) {
		return errs.Field("disk", "must be between 16 and %d MiB", max.DiskMiB)
	}
	if r.Pids < 0 || (r.Pids != 0 && r.Pids < 8) || (max.Pids > 0 && r.Pids > max.Pids) {
		return errs.Field("pids", "must be between 8 and %d", max.Pids)
	}
	return nil
}

// ValidExpiryAction checks the expiry action name.
func ValidExpiryAction(a ExpiryAction) error {
	switch a {
	case ExpireStop, ExpireDelete, ExpirePause:
		return nil
	}
	return errs.Field("expiry_action", "must be one of stop, delete, pause; got %q", a)
}

// ValidPauseMode checks the pause mode name.
func ValidPauseMode(m PauseMode) error {
	switch m {
	case PauseFreeze, PauseMemory, PauseDisk:
		return nil
	}
	return errs.Field("mode", "must be one of freeze, memory, disk; got %q", m)
}

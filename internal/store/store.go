// Package store holds all of berth's persistent state and all of its SQL.
//
// Store is the seam between the daemon and its state backend: the embedded
// SQLite backend (*SQLite) implements it for one host, and a cluster backend
// (e.g. on the Kubernetes API) can implement it later. Every backend must
// pass storetest.TestStore, the conformance suite in internal/store/storetest.
package store

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Store is everything berth persists. Errors carry internal/errs kinds:
// NotFound for a missing entity, AlreadyExists for a duplicate key,
// InvalidArgument (naming the field) for bad input, Conflict for a lost
// optimistic-concurrency race. Errors returned by caller callbacks and by
// sandbox.Transition are returned unwrapped.
type Store interface {
	CheckpointStore // checkpoints.go
	TaskStore       // tasks.go
	NoteStore       // notes.go
	AuditStore      // audit.go
	EffectStore     // effects.go
	LeaseStore      // leases.go
	// CreateSandbox inserts sb and sets sb.Version to 1 (and sb.CreatedAt to
	// now when zero).
	CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error
	GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// SandboxByTokenHash finds the sandbox whose AccessTokenHash is hash (NotFound if none).
	SandboxByTokenHash(ctx context.Context, hash string) (*sandbox.Sandbox, error)
	// ListSandboxes returns one page of matching sandboxes and the cursor of
	// the next page ("" on the last page); pass it as SandboxFilter.After.
	ListSandboxes(ctx context.Context, f SandboxFilter) (items []*sandbox.Sandbox, next string, err error)
	// UpdateSandbox loads the sandbox, lets fn modify it and writes it back,
	// all in one transaction, incrementing Version. If fn returns an error
	// nothing is written and that error is returned as is. fn may run more
	// than once in backends that retry on conflict, so it must be free of
	// side effects.
	UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	// DeleteSandbox removes the sandbox's row; its events stay.
	DeleteSandbox(ctx context.Context, id string) error
	// Transition moves the sandbox to state `to` and appends ev (with
	// SandboxID, Owner, From and To filled in) in one transaction. An illegal
	// move returns sandbox.Transition's *TransitionError untouched and writes
	// nothing. fn (may be nil) runs before the state is set.
	Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error)

	// AppendEvent stores ev (Time defaults to now) and returns its sequence
	// number; sequence numbers increase and are never reused.
	AppendEvent(ctx context.Context, ev sandbox.Event) (int64, error)
	// ListEvents returns matching events in ascending Seq order.
	ListEvents(ctx context.Context, f EventFilter) ([]sandbox.Event, error)

	CreateAPIKey(ctx context.Context, k APIKey) error
	LookupAPIKey(ctx context.Context, hash []byte) (APIKey, error)
	// ListAPIKeys lists the keys of owner, or every key when owner is "",
	// ordered by id.
	ListAPIKeys(ctx context.Context, owner string) ([]APIKey, error)
	DeleteAPIKey(ctx context.Context, id string) error

	// PutTemplate inserts or replaces the template named t.Name and returns
	// what was stored: CreatedAt is kept from an existing row (or set to now
	// when zero on insert); UpdatedAt is set to now when zero.
	PutTemplate(ctx context.Context, t Template) (Template, error)
	GetTemplate(ctx context.Context, name string) (Template, error)
	// ListTemplates returns every template ordered by name.
	ListTemplates(ctx context.Context) ([]Template, error)
	DeleteTemplate(ctx context.Context, name string) error

	// GetSetting returns a NotFound error for a key never put.
	GetSetting(ctx context.Context, key string) (string, error)
	PutSetting(ctx context.Context, key, val string) error

	// AppendEgress stores egress decisions in one transaction, assigning
	// increasing Seq numbers (Time defaults to now).
	AppendEgress(ctx context.Context, entries []EgressEntry) error
	// ListEgress returns matching entries in ascending Seq order.
	ListEgress(ctx context.Context, f EgressFilter) ([]EgressEntry, error)

	// PutSecret inserts or replaces the secret (Owner, Name) and returns what
	// was stored (CreatedAt kept from an existing row).
	PutSecret(ctx context.Context, s Secret) (Secret, error)
	GetSecret(ctx context.Context, owner, name string) (Secret, error)
	// ListSecrets lists owner's secrets ("" = every owner) by owner, name.
	ListSecrets(ctx context.Context, owner string) ([]Secret, error)
	DeleteSecret(ctx context.Context, owner, name string) error

	// CreateSnapshot inserts a snapshot; a duplicate id or a duplicate
	// non-empty name of the same owner is AlreadyExists.
	CreateSnapshot(ctx context.Context, sn Snapshot) error
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots lists owner's snapshots ("" = every owner), oldest first.
	ListSnapshots(ctx context.Context, owner string) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error

	// CreateMerge inserts a merge and its conflicts; a second open merge
	// of one target is AlreadyExists. Deleting the target deletes them.
	CreateMerge(ctx context.Context, m Merge, cs []MergeConflict) error
	GetMerge(ctx context.Context, id string) (Merge, error)
	// ListMerges lists the merges into target ("" = all), oldest first.
	ListMerges(ctx context.Context, target string) ([]Merge, error)
	// UpdateMerge changes an open merge (state, plan, result, reason).
	UpdateMerge(ctx context.Context, m Merge) error
	ListMergeConflicts(ctx context.Context, mergeID string) ([]MergeConflict, error)
	// ResolveMergeConflict records a resolution and the updated plan at once.
	ResolveMergeConflict(ctx context.Context, mergeID, conflictID string, resolution, plan []byte) error

	// RecordUsage writes metering steps in one transaction: each record's
	// Usage replaces the sandbox's cursor row, its Inc is added to the hour
	// bucket starting at Hour (skipped when Hour is zero).
	RecordUsage(ctx context.Context, recs []UsageRecord) error
	// ListUsage sums hour buckets per sandbox, ordered by sandbox id.
	ListUsage(ctx context.Context, f UsageFilter) ([]metering.Usage, error)
	// PutQuota stores owner's limits; GetQuota is NotFound when none are
	// stored; DeleteQuota is NotFound when there was nothing to delete.
	PutQuota(ctx context.Context, owner string, l quota.Limits) error
	GetQuota(ctx context.Context, owner string) (quota.Limits, error)
	ListQuotas(ctx context.Context) (map[string]quota.Limits, error)
	DeleteQuota(ctx context.Context, owner string) error

	// AppendActivity stores recorded activity entries in one transaction,
	// dropping those of a sandbox that no longer exists; lifecycle events
	// and egress entries join a sandbox's activity by themselves.
	AppendActivity(ctx context.Context, entries []ActivityEntry) error
	// ListActivity returns one sandbox's activity in ascending Seq order.
	ListActivity(ctx context.Context, f ActivityFilter) ([]ActivityEntry, error)
	// PruneActivity keeps a sandbox's newest keep entries.
	PruneActivity(ctx context.Context, sandboxID string, keep int) (int64, error)
	// ActivityTouched counts per sandbox the entries after seq, and returns
	// the largest seq. Deleting a sandbox deletes its activity.
	ActivityTouched(ctx context.Context, afterSeq int64) (map[string]int64, int64, error)
	// UsageHours returns the hour buckets of matching usage, each with its
	// sandbox's owner, template and reserved size, ordered by hour then
	// sandbox id.
	UsageHours(ctx context.Context, f UsageHoursFilter) ([]UsageHour, error)
	// AppendTemplateBuild records one finished import, pull or build and
	// returns its sequence number; a template keeps its newest
	// MaxTemplateBuilds rows.
	AppendTemplateBuild(ctx context.Context, b TemplateBuild) (int64, error)
	// ListTemplateBuilds returns template's builds ("" = every template),
	// newest first, at most limit (0 = MaxTemplateBuilds).
	ListTemplateBuilds(ctx context.Context, template string, limit int) ([]TemplateBuild, error)

	Close() error
}

// Sort orders for SandboxFilter.Order (by creation time, then id).
const (
	OrderAsc  = "asc"
	OrderDesc = "desc"
)

// SandboxFilter selects sandboxes; zero fields match everything.
type SandboxFilter struct {
	Owner        string
	States       []sandbox.State
	Labels       map[string]string // every pair must match
	Template     string
	CreatedAfter time.Time
	// ExpiresBy, when set, keeps only sandboxes with an expiry at or before
	// it (the expiry scan's filter: a sandbox without one never matches).
	ExpiresBy time.Time
	Order     string // OrderAsc (default) or OrderDesc
	Limit     int    // page size; 0 means no limit
	After     string // opaque cursor returned by the previous page
}

// EventFilter selects events; zero fields match everything.
type EventFilter struct {
	SandboxID string
	Owner     string
	AfterSeq  int64
	Limit     int // 0 means no limit
}

// APIKey maps the hash of a secret key to an owner.
type APIKey struct {
	ID        string
	Owner     string
	Hash      []byte // sha256 of the key; the key itself is never stored
	Admin     bool
	CreatedAt time.Time
}

// Template build states.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// Template is a stored environment definition and its build status.
type Template struct {
	Name        string
	Fingerprint string
	Layers      []string // layer digests, top first
	StartCmd    []string
	Env         map[string]string
	Workdir     string
	User        string
	Resources   sandbox.Resources
	State       string // TemplateBuilding, TemplateReady or TemplateFailed
	Progress    string
	Error       string
	Source      string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

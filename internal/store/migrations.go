package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
)

// migrations is the schema history: migrations[i] takes the database from
// PRAGMA user_version i to i+1. Append a new entry to change the schema
// (new tables for snapshots, pools, secrets, egress log, usage, ...); never
// edit an entry that has shipped.
var migrations = []string{
	// 1: sandboxes, events, api keys, templates, settings.
	`
CREATE TABLE sandboxes (
	id              TEXT PRIMARY KEY,
	owner           TEXT NOT NULL,
	template        TEXT NOT NULL,
	template_id     TEXT NOT NULL,
	runtime         TEXT NOT NULL,
	state           TEXT NOT NULL,
	reason          TEXT NOT NULL,
	message         TEXT NOT NULL,
	labels          TEXT,            -- JSON object or NULL
	env             TEXT,            -- JSON object or NULL
	cpu_millis      INTEGER NOT NULL,
	memory_mib      INTEGER NOT NULL,
	disk_mib        INTEGER NOT NULL,
	pids            INTEGER NOT NULL,
	created_at      INTEGER NOT NULL, -- unix nanoseconds, 0 = zero time
	started_at      INTEGER NOT NULL,
	expires_at      INTEGER NOT NULL,
	expiry_action   TEXT NOT NULL,
	access_token    TEXT NOT NULL,
	pause_requested TEXT NOT NULL,
	pause_actual    TEXT NOT NULL,
	resumed_from    TEXT NOT NULL,
	restore_count   INTEGER NOT NULL,
	auto_resume     INTEGER NOT NULL,
	extra           TEXT,            -- JSON object or NULL
	version         INTEGER NOT NULL
) STRICT;
CREATE INDEX sandboxes_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_owner_created ON sandboxes (owner, created_at, id);
CREATE INDEX sandboxes_state ON sandboxes (state);

CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL,
	owner      TEXT NOT NULL,
	time       INTEGER NOT NULL,
	actor      TEXT NOT NULL,
	type       TEXT NOT NULL,
	from_state TEXT NOT NULL,
	to_state   TEXT NOT NULL,
	reason     TEXT NOT NULL,
	message    TEXT NOT NULL,
	data       TEXT             -- JSON object or NULL
) STRICT;
CREATE INDEX events_sandbox ON events (sandbox_id, seq);
CREATE INDEX events_owner ON events (owner, seq);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	hash       BLOB NOT NULL UNIQUE,
	admin      INTEGER NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX api_keys_owner ON api_keys (owner, id);

CREATE TABLE templates (
	name        TEXT PRIMARY KEY,
	fingerprint TEXT NOT NULL,
	layers      TEXT,            -- JSON array or NULL
	start_cmd   TEXT,            -- JSON array or NULL
	env         TEXT,            -- JSON object or NULL
	workdir     TEXT NOT NULL,
	user        TEXT NOT NULL,
	cpu_millis  INTEGER NOT NULL,
	memory_mib  INTEGER NOT NULL,
	disk_mib    INTEGER NOT NULL,
	pids        INTEGER NOT NULL,
	state       TEXT NOT NULL,
	progress    TEXT NOT NULL,
	error       TEXT NOT NULL,
	source      TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
) STRICT;
`,
	// 2: look up sandboxes by their envd access token (E2B's old-SDK routing).
	`CREATE INDEX sandboxes_access_token ON sandboxes (access_token);`,
	// 3: snapshots (a sandbox's filesystem as a layer, optionally a memory image).
	`
CREATE TABLE snapshots (
	id             TEXT PRIMARY KEY,
	owner          TEXT NOT NULL,
	name           TEXT NOT NULL,
	source_sandbox TEXT NOT NULL,
	template       TEXT NOT NULL,
	template_id    TEXT NOT NULL,
	runtime        TEXT NOT NULL,
	layers         TEXT,            -- JSON array
	memory_path    TEXT NOT NULL,
	created_at     INTEGER NOT NULL,
	extra          TEXT             -- JSON object or NULL
) STRICT;
CREATE INDEX snapshots_owner ON snapshots (owner, created_at, id);
CREATE UNIQUE INDEX snapshots_owner_name ON snapshots (owner, name) WHERE name != '';
`,
	// 4: metering (per-sandbox cursor and lifetime row, hourly usage buckets)
	// and per-owner quotas set through the admin API.
	`
CREATE TABLE usage (
	sandbox_id     TEXT PRIMARY KEY,
	owner          TEXT NOT NULL,
	template       TEXT NOT NULL,
	state          TEXT NOT NULL,
	cpu_millis     INTEGER NOT NULL,
	memory_mib     INTEGER NOT NULL,
	disk_mib       INTEGER NOT NULL,
	created_at     INTEGER NOT NULL,
	last_sample_at INTEGER NOT NULL,
	last_cpu_nanos INTEGER NOT NULL,
	disk_bytes     INTEGER NOT NULL,
	last_active_at INTEGER NOT NULL,
	signals        TEXT NOT NULL     -- reaper signal state, JSON
) STRICT;
CREATE INDEX usage_owner ON usage (owner, sandbox_id);

CREATE TABLE usage_hours (
	sandbox_id      TEXT NOT NULL,
	hour            INTEGER NOT NULL, -- unix nanoseconds of the hour's start
	owner           TEXT NOT NULL,
	cpu_seconds     REAL NOT NULL,
	mem_gib_seconds REAL NOT NULL,
	mem_peak_bytes  INTEGER NOT NULL,
	running_seconds REAL NOT NULL,
	frozen_seconds  REAL NOT NULL,
	paused_seconds  REAL NOT NULL,
	stopped_seconds REAL NOT NULL,
	disk_gib_hours  REAL NOT NULL,
	PRIMARY KEY (sandbox_id, hour)
) STRICT;
CREATE INDEX usage_hours_owner ON usage_hours (owner, hour);

CREATE TABLE quotas (
	owner      TEXT PRIMARY KEY,
	sandboxes  INTEGER NOT NULL,
	cpu        REAL NOT NULL,
	memory_mib INTEGER NOT NULL,
	disk_mib   INTEGER NOT NULL,
	snapshots  INTEGER NOT NULL
) STRICT;
`,
	// 5: egress log (every network decision, queryable after a restart) and
	// secrets (values sealed by the daemon; never plaintext).
	`
CREATE TABLE egress_log (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id  TEXT NOT NULL,
	owner       TEXT NOT NULL,
	time        INTEGER NOT NULL,
	proto       TEXT NOT NULL,
	dst_ip      TEXT NOT NULL,
	dst_port    INTEGER NOT NULL,
	host        TEXT NOT NULL,
	rule        TEXT NOT NULL,
	verdict     TEXT NOT NULL,
	reason      TEXT NOT NULL,
	intercepted INTEGER NOT NULL,
	bytes_out   INTEGER NOT NULL,
	bytes_in    INTEGER NOT NULL,
	duration_ns INTEGER NOT NULL
) STRICT;
CREATE INDEX egress_log_sandbox ON egress_log (sandbox_id, seq);

CREATE TABLE secrets (
	owner      TEXT NOT NULL,
	name       TEXT NOT NULL,
	host       TEXT NOT NULL,
	header     TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (owner, name)
) STRICT;
`,
	// 6: sandboxes.access_token holds the hex SHA-256 of the envd token, not
	// the token (hashAccessTokens rewrites the rows of older versions).
	`CREATE INDEX IF NOT EXISTS sandboxes_access_token ON sandboxes (access_token);`,
	// 7: the schema-less extra map becomes attrs, the JSON of the typed
	// sandbox.Attrs (typedAttrs converts every row, then extra is dropped).
	`ALTER TABLE sandboxes ADD COLUMN attrs TEXT NOT NULL DEFAULT '{}';`,
	// 8: activity (issue 19): a sandbox's timeline (internal/activity). Rows
	// the recorder writes carry their own data; lifecycle events and egress
	// decisions are not copied: their rows point at the events / egress_log
	// row (event_seq, egress_seq), which ListActivity joins. The triggers add
	// those pointer rows in the transaction that appends the event or the
	// egress entry (a pause or resume row also keeps the modes the sandbox
	// row holds at that moment), and drop a sandbox's timeline when its
	// row is deleted. Existing events of live sandboxes are backfilled.
	activitySchema,
	// 9: template build history (issue 19), one row per import, pull or
	// Dockerfile build (the console's pools and templates view).
	`
CREATE TABLE template_builds (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	template    TEXT NOT NULL,
	kind        TEXT NOT NULL,    -- import | pull | build
	source      TEXT NOT NULL,
	started_at  INTEGER NOT NULL, -- unix nanoseconds
	ended_at    INTEGER NOT NULL,
	result      TEXT NOT NULL,    -- ready | failed
	fingerprint TEXT NOT NULL,
	layers      INTEGER NOT NULL,
	error       TEXT NOT NULL
) STRICT;
CREATE INDEX template_builds_template ON template_builds (template, seq);
`,
	// 10: merges of a fork into its target and their conflicts (issue 18).
	// A merge's rows go with its target sandbox; at most one merge per
	// target is open (planned or conflicted).
	`
CREATE TABLE merges (
	id              TEXT PRIMARY KEY,
	owner           TEXT NOT NULL,
	target          TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	source          TEXT NOT NULL,
	base_snapshot   TEXT NOT NULL,
	source_snapshot TEXT NOT NULL,
	source_layer    TEXT NOT NULL,
	strategy        TEXT NOT NULL,
	state           TEXT NOT NULL,
	plan_json       TEXT NOT NULL,
	result_json     TEXT NOT NULL,
	reason          TEXT NOT NULL,
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX merges_target ON merges (target, created_at);
CREATE UNIQUE INDEX merges_open ON merges (target) WHERE state IN ('planned', 'conflicted');

CREATE TABLE merge_conflicts (
	merge_id    TEXT NOT NULL REFERENCES merges (id) ON DELETE CASCADE,
	conflict_id TEXT NOT NULL,
	seq         INTEGER NOT NULL,
	path        TEXT NOT NULL,
	kind        TEXT NOT NULL,
	message     TEXT NOT NULL,
	data        TEXT NOT NULL,
	resolution  TEXT NOT NULL,
	PRIMARY KEY (merge_id, conflict_id)
) STRICT;
`,
	// 11: checkpoints on a sandbox's timeline (internal/timeline) and the head
	// each sandbox's next checkpoint is a delta against.
	`
CREATE TABLE checkpoints (
	id          TEXT PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	owner       TEXT NOT NULL,
	seq         INTEGER NOT NULL,
	name        TEXT NOT NULL,
	layer       TEXT NOT NULL,
	layers      TEXT,            -- JSON array, top first
	prev        TEXT NOT NULL,
	runtime     TEXT NOT NULL,
	memory_path TEXT NOT NULL,
	mode        TEXT NOT NULL,
	reason      TEXT NOT NULL,
	bytes       INTEGER NOT NULL,
	entries     INTEGER NOT NULL,
	created_at  INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX checkpoints_sandbox_seq ON checkpoints (sandbox_id, seq);
CREATE UNIQUE INDEX checkpoints_sandbox_name ON checkpoints (sandbox_id, name) WHERE name != '';
CREATE INDEX checkpoints_owner ON checkpoints (owner);
CREATE TABLE timeline_heads (
	sandbox_id TEXT PRIMARY KEY,
	checkpoint TEXT NOT NULL,
	layers     TEXT             -- JSON array, top first
) STRICT;
`,
	// 12: the task ledger (internal/tasks): each sandbox's tasks as they are
	// now, the append-only change log they are replayed from (the ledger at
	// any time T), and a per-sandbox record (the last restore's warning).
	// All of it goes with its sandbox.
	`
CREATE TABLE tasks (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	task_id    TEXT NOT NULL,
	seq        INTEGER NOT NULL, -- creation order within the sandbox
	state      TEXT NOT NULL,    -- JSON, the service's
	brief      TEXT NOT NULL,    -- JSON, the service's summary of state
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, task_id)
) STRICT;
CREATE TABLE task_changes (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	task_id    TEXT NOT NULL,
	time       INTEGER NOT NULL,
	actor      TEXT NOT NULL,
	op         TEXT NOT NULL,
	data       TEXT NOT NULL     -- JSON, the service's
) STRICT;
CREATE INDEX task_changes_sandbox ON task_changes (sandbox_id, seq);
CREATE TABLE task_ledgers (
	sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
	data       TEXT NOT NULL     -- JSON, the service's
) STRICT;
`,
	// 13: handoff notes (internal/notes). body
	// is the JSON of the note the service wrote, manifest the file manifest
	// the next note is diffed against (kept on the newest notes only). A
	// sandbox's notes go with its row.
	notesSchema,
	// 14: the audit chain (issue 17) (internal/audit). Rows
	// are appended by the chain's one writer with the seq it assigned; each
	// row's hash covers the previous row's, and its mac is the audit key's
	// MAC over (seq, hash). audit_head is the chain's last
	// (seq, hash) with the MAC the daemon's audit key gives it, written in the
	// transaction of the rows. No row references a sandbox: deleting a
	// sandbox never deletes its audit entries, and the triggers refuse an
	// UPDATE or DELETE of a row from any code path (an edit through another
	// tool must drop them first, and verify still catches it).
	`
CREATE TABLE audit (
	seq        INTEGER PRIMARY KEY,
	time       INTEGER NOT NULL, -- unix nanoseconds
	actor      TEXT NOT NULL,
	action     TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	owner      TEXT NOT NULL,
	data       TEXT NOT NULL,    -- JSON object of strings
	prev_hash  TEXT NOT NULL,
	hash       TEXT NOT NULL,
	mac        TEXT NOT NULL
) STRICT;
CREATE INDEX audit_sandbox ON audit (sandbox_id, seq);
CREATE INDEX audit_owner ON audit (owner, seq);
CREATE INDEX audit_time ON audit (time);
CREATE TABLE audit_head (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	seq  INTEGER NOT NULL,
	hash TEXT NOT NULL,
	mac  TEXT NOT NULL
) STRICT;
CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;
CREATE TRIGGER audit_append_only_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;
`,
	// 15: the side-effect ledger (internal/effects): one row per
	// recorded request (intent, then outcome), and each sandbox's place in
	// its lineage (root, parent, fork point, restore windows). Rows are
	// kept when a sandbox is deleted: a fork's retry must still find them.
	`
CREATE TABLE effects (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT NOT NULL UNIQUE,
	lineage      TEXT NOT NULL,
	sandbox_id   TEXT NOT NULL,
	owner        TEXT NOT NULL,
	step         TEXT NOT NULL,
	method       TEXT NOT NULL,
	host         TEXT NOT NULL,
	path         TEXT NOT NULL,
	body_sha256  TEXT NOT NULL,
	body_size    INTEGER NOT NULL,
	idem_key     TEXT NOT NULL,
	key_source   TEXT NOT NULL,
	identity     TEXT NOT NULL,
	secret       INTEGER NOT NULL,
	state        TEXT NOT NULL,
	status       INTEGER NOT NULL,
	resp_size    INTEGER NOT NULL,
	reason       TEXT NOT NULL,
	started_at   INTEGER NOT NULL,
	ended_at     INTEGER NOT NULL,
	replay       BLOB
) STRICT;
CREATE INDEX effects_sandbox ON effects (sandbox_id, started_at);
CREATE INDEX effects_key ON effects (lineage, idem_key) WHERE idem_key != '';
CREATE INDEX effects_identity ON effects (lineage, identity);
CREATE TABLE effect_scopes (
	sandbox_id TEXT PRIMARY KEY,
	lineage    TEXT NOT NULL,
	parent     TEXT NOT NULL,
	point_at   INTEGER NOT NULL,
	windows    TEXT
) STRICT;
`,
	// 16: credential leases (internal/leases), one row per secret
	// issued to one generation of a sandbox; deleted with the sandbox.
	`
CREATE TABLE leases (
	id          TEXT PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	owner       TEXT NOT NULL,
	generation  INTEGER NOT NULL,
	secret      TEXT NOT NULL,
	host        TEXT NOT NULL,
	header      TEXT NOT NULL,
	placeholder TEXT NOT NULL UNIQUE,
	issued_at   INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	state       TEXT NOT NULL,
	reason      TEXT NOT NULL,
	changed_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX leases_sandbox ON leases (sandbox_id, generation);
CREATE INDEX leases_owner ON leases (owner, issued_at);
`,
}

// migrationHooks run in the transaction of the migration with the same
// number, after its SQL: the steps SQL cannot express.
var migrationHooks = map[int]func(context.Context, *sql.Tx) error{
	6: hashAccessTokens,
	7: typedAttrs,
}

// hashAccessTokens replaces every plain envd access token with its hex
// SHA-256 (what daemon.EnvdToken's tokens are checked against).
func hashAccessTokens(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, access_token FROM sandboxes WHERE access_token != ''`)
	if err != nil {
		return err
	}
	plain := map[string]string{}
	for rows.Next() {
		var id, tok string
		if err := rows.Scan(&id, &tok); err != nil {
			rows.Close()
			return err
		}
		plain[id] = tok
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	for id, tok := range plain {
		h := sha256.Sum256([]byte(tok))
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET access_token = ? WHERE id = ?`, hex.EncodeToString(h[:]), id); err != nil {
			return err
		}
	}
	return nil
}

// typedAttrs converts each sandbox's extra map into sandbox.Attrs. A key
// it cannot place (unknown, or a value that does not parse) is not lost: it
// is kept in a "migrated" event of that sandbox, whose data holds it verbatim.
func typedAttrs(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, owner, extra FROM sandboxes WHERE extra IS NOT NULL AND extra != ''`)
	if err != nil {
		return err
	}
	type row struct{ id, owner, extra string }
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.owner, &r.extra); err != nil {
			rows.Close()
			return err
		}
		all = append(all, r)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	now := toNanos(time.Now())
	for _, r := range all {
		var extra map[string]string
		if err := json.Unmarshal([]byte(r.extra), &extra); err != nil {
			return fmt.Errorf("sandbox %s: extra is not a JSON object of strings: %w", r.id, err)
		}
		a, left := sandbox.AttrsFromExtra(extra)
		b, err := json.Marshal(a)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET attrs = ? WHERE id = ?`, string(b), r.id); err != nil {
			return err
		}
		if len(left) == 0 {
			continue
		}
		data, _ := json.Marshal(left)
		if _, err := tx.ExecContext(ctx, `INSERT INTO events
			(sandbox_id, owner, time, actor, type, from_state, to_state, reason, message, data)
			VALUES (?, ?, ?, 'system', 'migrated', '', '', 'extra_keys_kept', ?, ?)`,
			r.id, r.owner, now, "keys of the old extra map the typed model has no field for, kept here verbatim", string(data)); err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, `ALTER TABLE sandboxes DROP COLUMN extra`)
	return err
}

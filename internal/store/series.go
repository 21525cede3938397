package store

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/sandbox"
)

// UsageHoursFilter selects hour buckets: of Owner ("" = every owner), whose
// hour starts in [From truncated to the hour, To) (zero = unbounded).
type UsageHoursFilter struct {
	Owner string
	From  time.Time
	To    time.Time
}

// UsageHour is one sandbox's usage increments in the hour starting at Hour.
// Usage carries the sandbox's id, owner, template and reserved size (from
// its cursor row) and the hour's sums; its cursor fields are zero.
type UsageHour struct {
	Hour  time.Time
	Usage metering.Usage
}

func (s *meteringTables) UsageHours(ctx context.Context, f UsageHoursFilter) ([]UsageHour, error) {
	from, to := int64(0), int64(1<<63-1)
	if !f.From.IsZero() {
		from = f.From.Truncate(time.Hour).UnixNano()
	}
	if !f.To.IsZero() {
		to = f.To.UnixNano()
	}
	rows, err := s.r.QueryContext(ctx, `SELECT h.hour, h.sandbox_id, h.owner, coalesce(u.template, ''),
		coalesce(u.state, ''), coalesce(u.cpu_millis, 0), coalesce(u.memory_mib, 0), coalesce(u.disk_mib, 0),
		h.cpu_seconds, h.mem_gib_seconds, h.mem_peak_bytes, h.running_seconds, h.frozen_seconds, h.paused_seconds,
		h.stopped_seconds, h.disk_gib_hours
		FROM usage_hours h LEFT JOIN usage u ON u.sandbox_id = h.sandbox_id
		WHERE (? = '' OR h.owner = ?) AND h.hour >= ? AND h.hour < ?
		ORDER BY h.hour, h.sandbox_id`, f.Owner, f.Owner, from, to)
	if err != nil {
		return nil, dbErr(err, "store: usage hours")
	}
	defer rows.Close()
	out := []UsageHour{}
	for rows.Next() {
		var (
			h     UsageHour
			hour  int64
			state string
			peak  int64
		)
		u := &h.Usage
		if err := rows.Scan(&hour, &u.SandboxID, &u.Owner, &u.Template, &state, &u.Reserved.CPUMillis,
			&u.Reserved.MemoryMiB, &u.Reserved.DiskMiB, &u.CPUSeconds, &u.MemGiBSeconds, &peak, &u.RunningSeconds,
			&u.FrozenSeconds, &u.PausedSeconds, &u.StoppedSeconds, &u.DiskGiBHours); err != nil {
			return nil, dbErr(err, "store: scan usage hour")
		}
		h.Hour, u.State, u.MemPeakBytes = fromNanos(hour), sandbox.State(state), uint64(peak)
		out = append(out, h)
	}
	return out, dbErr(rows.Err(), "store: usage hours")
}

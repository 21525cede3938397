package kubestore

import (
	"context"
	"sort"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Tables of this file.
const (
	tableUsage     = "usage"     // key sandbox id: the cursor and its open hour
	tableUsageHour = "usagehr"   // key sandbox|hour: a closed hour bucket
	tableQuota     = "quota"     // key owner
	tableEgress    = "egress"    // key seq
	tableBuild     = "tbuild"    // key template|n (n-th build of the template)
	tableBuildSeq  = "tbuildseq" // one row: the global build seq and each template's count
	// counterActivity numbers activity and egress rows alike: an egress
	// entry and its activity row share one number, so a batch of egress
	// reserves its numbers once.
	counterActivity = "activity"
)

// usageBucket is one hour's increments of one sandbox.
type usageBucket struct {
	SandboxID      string    `json:"sandbox"`
	Hour           time.Time `json:"hour"`
	Owner          string    `json:"owner"`
	CPUSeconds     float64   `json:"cpu,omitempty"`
	MemGiBSeconds  float64   `json:"mem,omitempty"`
	MemPeakBytes   uint64    `json:"peak,omitempty"`
	RunningSeconds float64   `json:"running,omitempty"`
	FrozenSeconds  float64   `json:"frozen,omitempty"`
	PausedSeconds  float64   `json:"paused,omitempty"`
	StoppedSeconds float64   `json:"stopped,omitempty"`
	DiskGiBHours   float64   `json:"disk,omitempty"`
}

func (b *usageBucket) add(in metering.Usage) {
	b.CPUSeconds += in.CPUSeconds
	b.MemGiBSeconds += in.MemGiBSeconds
	b.MemPeakBytes = max(b.MemPeakBytes, in.MemPeakBytes)
	b.RunningSeconds += in.RunningSeconds
	b.FrozenSeconds += in.FrozenSeconds
	b.PausedSeconds += in.PausedSeconds
	b.StoppedSeconds += in.StoppedSeconds
	b.DiskGiBHours += in.DiskGiBHours
}

func (b *usageBucket) addTo(u *metering.Usage) {
	u.CPUSeconds += b.CPUSeconds
	u.MemGiBSeconds += b.MemGiBSeconds
	u.MemPeakBytes = max(u.MemPeakBytes, b.MemPeakBytes)
	u.RunningSeconds += b.RunningSeconds
	u.FrozenSeconds += b.FrozenSeconds
	u.PausedSeconds += b.PausedSeconds
	u.StoppedSeconds += b.StoppedSeconds
	u.DiskGiBHours += b.DiskGiBHours
}

// usageCursor is a sandbox's usage row. It carries the sandbox's newest
// hour bucket (Open) itself, so a metering step inside one hour is one
// conditional write of one object: the cursor and the increment it
// accounts for cannot part. A bucket is written as a row of its own
// (absolute values, so writing it twice is harmless) when the next hour
// opens, before the cursor moves on.
type usageCursor struct {
	SandboxID    string            `json:"sandbox"`
	Owner        string            `json:"owner"`
	Template     string            `json:"template"`
	State        sandbox.State     `json:"state"`
	Reserved     sandbox.Resources `json:"reserved"`
	CreatedAt    time.Time         `json:"createdAt"`
	LastSampleAt time.Time         `json:"lastSampleAt"`
	LastCPUNanos uint64            `json:"lastCPUNanos,omitempty"`
	DiskBytes    uint64            `json:"diskBytes,omitempty"`
	LastActiveAt time.Time         `json:"lastActiveAt"`
	Signals      string            `json:"signals,omitempty"`
	Open         *usageBucket      `json:"open,omitempty"`
}

func cursorOf(u metering.Usage) usageCursor {
	return usageCursor{SandboxID: u.SandboxID, Owner: u.Owner, Template: u.Template, State: u.State, Reserved: u.Reserved,
		CreatedAt: u.CreatedAt, LastSampleAt: u.LastSampleAt, LastCPUNanos: u.LastCPUNanos, DiskBytes: u.DiskBytes,
		LastActiveAt: u.LastActiveAt, Signals: u.Signals}
}

func (c usageCursor) usage() metering.Usage {
	return metering.Usage{SandboxID: c.SandboxID, Owner: c.Owner, Template: c.Template, State: c.State, Reserved: c.Reserved,
		CreatedAt: c.CreatedAt, LastSampleAt: c.LastSampleAt, LastCPUNanos: c.LastCPUNanos, DiskBytes: c.DiskBytes,
		LastActiveAt: c.LastActiveAt, Signals: c.Signals}
}

func hourKey(id string, hour time.Time) string {
	return id + "|" + strconv.FormatInt(hour.UnixNano(), 10)
}

func bucketLabels(b *usageBucket) map[string]string {
	return map[string]string{labelSandbox: b.SandboxID, "berth.dev/owner": b.Owner}
}

// RecordUsage writes each record's step: usually one read and one
// conditional write of the sandbox's usage row. Records are written in
// order; a failure leaves the earlier ones written (each is whole).
func (s *Store) RecordUsage(ctx context.Context, recs []store.UsageRecord) error {
	for _, r := range recs {
		if !sandbox.ValidID(r.Usage.SandboxID) {
			return errs.Field("id", "must be 1-64 lowercase letters and digits, got %q", r.Usage.SandboxID)
		}
	}
	for _, r := range recs {
		if err := s.recordUsage(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) recordUsage(ctx context.Context, r store.UsageRecord) error {
	id := r.Usage.SandboxID
	labels := map[string]string{labelSandbox: id, "berth.dev/owner": r.Usage.Owner}
	hour := r.Hour.Truncate(time.Hour)
	lateDone := false
	for {
		var cur usageCursor
		old, err := s.get(ctx, tableUsage, id, &cur)
		absent := errs.Is(err, errs.NotFound)
		if err != nil && !absent {
			return err
		}
		next := cursorOf(r.Usage)
		if !absent {
			next.Open = cur.Open
		}
		switch {
		case r.Hour.IsZero() || lateDone:
		case next.Open == nil || next.Open.Hour.Equal(hour):
			if next.Open == nil {
				next.Open = &usageBucket{SandboxID: id, Hour: hour}
			}
			next.Open.Owner = r.Usage.Owner
			next.Open.add(r.Inc)
		case hour.After(next.Open.Hour):
			// Close the open hour first: a crash before the cursor's write
			// leaves that bucket both here and in the cursor, equal, and
			// readers take one of them.
			if err := s.upsert(ctx, tableUsageHour, hourKey(id, next.Open.Hour), 0, bucketLabels(next.Open), next.Open); err != nil {
				return err
			}
			next.Open = &usageBucket{SandboxID: id, Hour: hour, Owner: r.Usage.Owner}
			next.Open.add(r.Inc)
		default:
			// A late step for an hour already closed: add to its row, then
			// write the cursor without it (on a retry too).
			var b usageBucket
			if err := s.mutate(ctx, tableUsageHour, hourKey(id, hour), map[string]string{labelSandbox: id, "berth.dev/owner": r.Usage.Owner},
				&b, func() { b = usageBucket{} }, func() error {
					b.SandboxID, b.Hour, b.Owner = id, hour, r.Usage.Owner
					b.add(r.Inc)
					return nil
				}); err != nil {
				return err
			}
			lateDone = true
		}
		if absent {
			_, err = s.create(ctx, tableUsage, id, 0, labels, next)
			if errs.Is(err, errs.AlreadyExists) {
				continue
			}
			return err
		}
		_, err = s.put(ctx, old, labels, next)
		if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
			continue
		}
		return err
	}
}

// usageRows reads the cursors (of owner and sandbox, "" = all) and their
// buckets: the closed rows of sandbox ("" = all) and the cursors' open
// ones, a closed row of the same hour as an open one yielding to it.
func (s *Store) usageRows(ctx context.Context, owner, sandboxID string) ([]usageCursor, []*usageBucket, error) {
	match := map[string]string{}
	if owner != "" {
		match["berth.dev/owner"] = owner
	}
	if sandboxID != "" {
		match[labelSandbox] = sandboxID
	}
	var crs, brs []row
	err := each(2, func(i int) error {
		var err error
		if i == 0 {
			crs, err = s.list(ctx, tableUsage, match)
		} else {
			bm := map[string]string{}
			if sandboxID != "" {
				bm[labelSandbox] = sandboxID
			}
			brs, err = s.list(ctx, tableUsageHour, bm)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	cursors, _, err := decodeRows[usageCursor](crs, tableUsage)
	if err != nil {
		return nil, nil, err
	}
	closed, _, err := decodeRows[usageBucket](brs, tableUsageHour)
	if err != nil {
		return nil, nil, err
	}
	var out []*usageBucket
	open := map[string]bool{}
	kept := cursors[:0]
	for _, c := range cursors {
		if (owner != "" && c.Owner != owner) || (sandboxID != "" && c.SandboxID != sandboxID) {
			continue
		}
		kept = append(kept, c)
	}
	for _, c := range kept {
		if c.Open != nil {
			out = append(out, c.Open)
			open[hourKey(c.SandboxID, c.Open.Hour)] = true
		}
	}
	for i := range closed {
		b := &closed[i]
		if sandboxID != "" && b.SandboxID != sandboxID {
			continue
		}
		if !open[hourKey(b.SandboxID, b.Hour)] {
			out = append(out, b)
		}
	}
	return kept, out, nil
}

// ListUsage sums each sandbox's buckets from f.Since on, by sandbox id.
func (s *Store) ListUsage(ctx context.Context, f store.UsageFilter) ([]metering.Usage, error) {
	cursors, buckets, err := s.usageRows(ctx, f.Owner, f.SandboxID)
	if err != nil {
		return nil, err
	}
	since := time.Time{}
	if !f.Since.IsZero() {
		since = f.Since.Truncate(time.Hour)
	}
	byID := map[string][]*usageBucket{}
	for _, b := range buckets {
		byID[b.SandboxID] = append(byID[b.SandboxID], b)
	}
	var out []metering.Usage
	for _, c := range cursors {
		u := c.usage()
		for _, b := range byID[c.SandboxID] {
			if !b.Hour.Before(since) {
				b.addTo(&u)
			}
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SandboxID < out[j].SandboxID })
	return out, nil
}

// UsageHours lists matching buckets with their cursor's template and size.
func (s *Store) UsageHours(ctx context.Context, f store.UsageHoursFilter) ([]store.UsageHour, error) {
	cursors, buckets, err := s.usageRows(ctx, "", "")
	if err != nil {
		return nil, err
	}
	from, to := time.Time{}, time.Time{}
	if !f.From.IsZero() {
		from = f.From.Truncate(time.Hour)
	}
	if !f.To.IsZero() {
		to = f.To
	}
	byID := map[string]usageCursor{}
	for _, c := range cursors {
		byID[c.SandboxID] = c
	}
	out := []store.UsageHour{}
	for _, b := range buckets {
		if (f.Owner != "" && b.Owner != f.Owner) || b.Hour.Before(from) || (!to.IsZero() && !b.Hour.Before(to)) {
			continue
		}
		c := byID[b.SandboxID]
		u := metering.Usage{SandboxID: b.SandboxID, Owner: b.Owner, Template: c.Template, State: c.State, Reserved: c.Reserved}
		b.addTo(&u)
		out = append(out, store.UsageHour{Hour: b.Hour, Usage: u})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Hour.Equal(out[j].Hour) {
			return out[i].Hour.Before(out[j].Hour)
		}
		return out[i].Usage.SandboxID < out[j].Usage.SandboxID
	})
	return out, nil
}

// PutQuota sets owner's limits (replacing any earlier ones).
func (s *Store) PutQuota(ctx context.Context, owner string, l quota.Limits) error {
	if owner == "" {
		return errs.Field("owner", "must not be empty")
	}
	if err := l.Validate(""); err != nil {
		return err
	}
	return s.upsert(ctx, tableQuota, owner, 0, nil, l)
}

// GetQuota returns NotFound for an owner without stored limits.
func (s *Store) GetQuota(ctx context.Context, owner string) (quota.Limits, error) {
	var l quota.Limits
	if _, err := s.get(ctx, tableQuota, owner, &l); err != nil {
		if errs.Is(err, errs.NotFound) {
			return quota.Limits{}, errs.E(errs.NotFound, "no quota stored for owner %q", owner)
		}
		return quota.Limits{}, err
	}
	return l, nil
}

// ListQuotas returns every stored quota by owner.
func (s *Store) ListQuotas(ctx context.Context) (map[string]quota.Limits, error) {
	rs, err := s.list(ctx, tableQuota, nil)
	if err != nil {
		return nil, err
	}
	out := map[string]quota.Limits{}
	for _, r := range rs {
		var l quota.Limits
		if err := r.decode(&l); err != nil {
			return nil, err
		}
		out[r.Spec.Key] = l
	}
	return out, nil
}

// DeleteQuota removes owner's stored limits (config limits apply again).
func (s *Store) DeleteQuota(ctx context.Context, owner string) error {
	if err := s.remove(ctx, tableQuota, owner); err != nil {
		if errs.Is(err, errs.NotFound) {
			return errs.E(errs.NotFound, "no quota stored for owner %q", owner)
		}
		return err
	}
	return nil
}

// egressRow is an egress log entry as stored.
type egressRow struct {
	Seq         int64     `json:"seq"`
	SandboxID   string    `json:"sandbox"`
	Owner       string    `json:"owner,omitempty"`
	Time        time.Time `json:"time"`
	Proto       string    `json:"proto,omitempty"`
	DstIP       string    `json:"dstIP,omitempty"`
	DstPort     int       `json:"dstPort,omitempty"`
	Host        string    `json:"host,omitempty"`
	Rule        string    `json:"rule,omitempty"`
	Verdict     string    `json:"verdict,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Intercepted bool      `json:"intercepted,omitempty"`
	BytesOut    int64     `json:"bytesOut,omitempty"`
	BytesIn     int64     `json:"bytesIn,omitempty"`
	DurationNS  int64     `json:"durationNS,omitempty"`
}

func egressRowOf(e store.EgressEntry) egressRow {
	return egressRow{Seq: e.Seq, SandboxID: e.SandboxID, Owner: e.Owner, Time: e.Time, Proto: e.Proto, DstIP: e.DstIP,
		DstPort: e.DstPort, Host: e.Host, Rule: e.Rule, Verdict: e.Verdict, Reason: e.Reason, Intercepted: e.Intercepted,
		BytesOut: e.BytesOut, BytesIn: e.BytesIn, DurationNS: int64(e.Duration)}
}

func (g egressRow) entry() store.EgressEntry {
	return store.EgressEntry{Seq: g.Seq, SandboxID: g.SandboxID, Owner: g.Owner, Time: g.Time, Proto: g.Proto, DstIP: g.DstIP,
		DstPort: g.DstPort, Host: g.Host, Rule: g.Rule, Verdict: g.Verdict, Reason: g.Reason, Intercepted: g.Intercepted,
		BytesOut: g.BytesOut, BytesIn: g.BytesIn, Duration: time.Duration(g.DurationNS)}
}

// AppendEgress numbers the entries with one reservation and writes them,
// then the activity rows of those whose sandbox exists. The log row goes
// first: a crash between leaves a decision logged but missing from the
// timeline, never a timeline entry pointing at nothing.
func (s *Store) AppendEgress(ctx context.Context, entries []store.EgressEntry) error {
	for _, e := range entries {
		if e.SandboxID == "" {
			return errs.Field("sandbox_id", "must not be empty")
		}
	}
	if len(entries) == 0 {
		return nil
	}
	base, err := s.nextSeq(ctx, counterActivity, int64(len(entries)))
	if err != nil {
		return err
	}
	rows := make([]egressRow, len(entries))
	for i, e := range entries {
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		e.Seq = base + int64(i)
		rows[i] = egressRowOf(e)
	}
	if err := each(len(rows), func(i int) error {
		g := rows[i]
		_, err := s.create(ctx, tableEgress, seqKey(g.Seq), g.Seq, map[string]string{labelSandbox: g.SandboxID, labelSeqBucket: bucketOf(g.Seq)}, g)
		return err
	}); err != nil {
		return err
	}
	acts := make([]activityRow, len(rows))
	for i := range rows {
		g := rows[i]
		acts[i] = activityRow{Seq: g.Seq, SandboxID: g.SandboxID, Time: g.Time, Kind: "egress", Actor: "egress", Egress: &g}
	}
	return s.writeActivity(ctx, acts, nil)
}

// ListEgress returns matching entries in ascending Seq order.
func (s *Store) ListEgress(ctx context.Context, f store.EgressFilter) ([]store.EgressEntry, error) {
	sel := berthv1.LabelTable + "=" + tableEgress
	if f.SandboxID != "" {
		sel += "," + labelSandbox + "=" + LabelValue(f.SandboxID)
	}
	if f.AfterSeq > 0 {
		// A follower's poll reads the newest buckets, not the whole log.
		at, err := s.counterAt(ctx, counterActivity)
		if err != nil || at <= f.AfterSeq {
			return nil, err
		}
		sel = afterSel(sel, f.AfterSeq, at)
	}
	rs, err := s.listSel(ctx, sel)
	if err != nil {
		return nil, err
	}
	gs, _, err := decodeRows[egressRow](rs, tableEgress)
	if err != nil {
		return nil, err
	}
	var out []store.EgressEntry
	for _, g := range gs {
		if g.Seq > f.AfterSeq && (f.SandboxID == "" || g.SandboxID == f.SandboxID) {
			out = append(out, g.entry())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// buildCounts is the one row numbering template builds: Seq the last
// global number, N each template's count (its rows are template|1..N, so
// the row a new build pushes out of the history is known by name).
type buildCounts struct {
	Seq int64            `json:"seq"`
	N   map[string]int64 `json:"n"`
}

type buildRow struct {
	Seq         int64     `json:"seq"`
	Template    string    `json:"template"`
	Kind        string    `json:"kind"`
	Source      string    `json:"source,omitempty"`
	StartedAt   time.Time `json:"startedAt"`
	EndedAt     time.Time `json:"endedAt"`
	Result      string    `json:"result"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	Layers      int       `json:"layers,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// AppendTemplateBuild numbers the build (one conditional write of the
// counter row), stores it, and deletes the row it pushed out of the
// template's history. A crash after the count leaves a number unused; a
// crash before the delete leaves one row too many, which the history's
// limit hides.
func (s *Store) AppendTemplateBuild(ctx context.Context, b store.TemplateBuild) (int64, error) {
	if b.Template == "" {
		return 0, errs.Field("template", "must not be empty")
	}
	switch b.Kind {
	case store.BuildImport, store.BuildPull, store.BuildDocker:
	default:
		return 0, errs.Field("kind", "must be one of %s, %s, %s; got %q", store.BuildImport, store.BuildPull, store.BuildDocker, b.Kind)
	}
	switch b.Result {
	case store.TemplateReady, store.TemplateFailed:
	default:
		return 0, errs.Field("result", "must be %s or %s; got %q", store.TemplateReady, store.TemplateFailed, b.Result)
	}
	if b.StartedAt.IsZero() || b.EndedAt.Before(b.StartedAt) {
		return 0, errs.Field("ended_at", "must not be before started_at (both set)")
	}
	var c buildCounts
	if err := s.mutate(ctx, tableBuildSeq, "", nil, &c, func() { c = buildCounts{} }, func() error {
		if c.N == nil {
			c.N = map[string]int64{}
		}
		c.Seq++
		c.N[b.Template]++
		return nil
	}); err != nil {
		return 0, err
	}
	n := c.N[b.Template]
	r := buildRow{Seq: c.Seq, Template: b.Template, Kind: b.Kind, Source: b.Source, StartedAt: b.StartedAt, EndedAt: b.EndedAt,
		Result: b.Result, Fingerprint: b.Fingerprint, Layers: b.Layers, Error: b.Error}
	if _, err := s.create(ctx, tableBuild, b.Template+"|"+strconv.FormatInt(n, 10), c.Seq, map[string]string{"berth.dev/template": b.Template}, r); err != nil {
		return 0, err
	}
	if old := n - store.MaxTemplateBuilds; old > 0 {
		if err := s.remove(ctx, tableBuild, b.Template+"|"+strconv.FormatInt(old, 10)); err != nil && !errs.Is(err, errs.NotFound) {
			return 0, err
		}
	}
	return c.Seq, nil
}

// ListTemplateBuilds returns template's builds ("" = all), newest first.
func (s *Store) ListTemplateBuilds(ctx context.Context, template string, limit int) ([]store.TemplateBuild, error) {
	if limit <= 0 || limit > store.MaxTemplateBuilds {
		limit = store.MaxTemplateBuilds
	}
	match := map[string]string{}
	if template != "" {
		match["berth.dev/template"] = template
	}
	rs, err := s.list(ctx, tableBuild, match)
	if err != nil {
		return nil, err
	}
	bs, _, err := decodeRows[buildRow](rs, tableBuild)
	if err != nil {
		return nil, err
	}
	out := []store.TemplateBuild{}
	for _, b := range bs {
		if template != "" && b.Template != template {
			continue
		}
		out = append(out, store.TemplateBuild{Seq: b.Seq, Template: b.Template, Kind: b.Kind, Source: b.Source, StartedAt: b.StartedAt,
			EndedAt: b.EndedAt, Result: b.Result, Fingerprint: b.Fingerprint, Layers: b.Layers, Error: b.Error})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq > out[j].Seq })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

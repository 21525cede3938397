package kubestore

import (
	"context"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

const tableActivity = "activity" // key seq

// activityRow is one timeline entry. A lifecycle, pause, resume or reaper
// entry keeps a copy of its event, an egress entry of its log row: what
// SQLite joins in when reading is copied in when writing, so reading a
// timeline is one list.
type activityRow struct {
	Seq       int64          `json:"seq"`
	SandboxID string         `json:"sandbox"`
	Time      time.Time      `json:"time"`
	Kind      string         `json:"kind"`
	Actor     string         `json:"actor,omitempty"`
	Summary   string         `json:"summary,omitempty"`
	Data      *string        `json:"data,omitempty"`
	Event     *sandbox.Event `json:"event,omitempty"`
	Egress    *egressRow     `json:"egress,omitempty"`
}

func activityLabels(a activityRow) map[string]string {
	return map[string]string{labelSandbox: a.SandboxID, labelWithSandbox: a.SandboxID,
		labelSeqBucket: bucketOf(a.Seq)}
}

// writeActivity stores rows (numbered) whose sandbox exists, and drops
// them again if it was deleted meanwhile: DeleteSandbox removes the
// object before its rows, so either its cascade sees a row written here or
// the re-check here sees the object gone. known holds sandboxes the caller
// just read (skipped by the first check).
func (s *Store) writeActivity(ctx context.Context, rows []activityRow, known map[string]bool) error {
	ids := map[string]bool{}
	for _, a := range rows {
		ids[a.SandboxID] = true
	}
	exists := func() (map[string]bool, error) {
		list := make([]string, 0, len(ids))
		for id := range ids {
			list = append(list, id)
		}
		got := make([]bool, len(list))
		err := each(len(list), func(i int) error {
			if known[list[i]] {
				got[i] = true
				return nil
			}
			ok, err := s.sandboxExists(ctx, list[i])
			got[i] = ok
			return err
		})
		out := map[string]bool{}
		for i, id := range list {
			out[id] = got[i]
		}
		return out, err
	}
	live, err := exists()
	if err != nil {
		return err
	}
	var keep []activityRow
	for _, a := range rows {
		if live[a.SandboxID] {
			keep = append(keep, a)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	if err := each(len(keep), func(i int) error {
		a := keep[i]
		_, err := s.create(ctx, tableActivity, seqKey(a.Seq), a.Seq, activityLabels(a), a)
		return err
	}); err != nil {
		return err
	}
	known = nil
	live, err = exists()
	if err != nil {
		return err
	}
	for id, ok := range live {
		if !ok {
			if err := s.deleteSandboxRowsB(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// AppendActivity stores recorded entries, dropping those of a sandbox that
// does not exist.
func (s *Store) AppendActivity(ctx context.Context, entries []store.ActivityEntry) error {
	for _, e := range entries {
		switch {
		case e.SandboxID == "":
			return errs.Field("sandbox_id", "must not be empty")
		case e.Kind == "":
			return errs.Field("kind", "must not be empty")
		}
	}
	// Numbers are reserved for live sandboxes only: check first.
	live := map[string]bool{}
	for _, e := range entries {
		if _, seen := live[e.SandboxID]; seen {
			continue
		}
		ok, err := s.sandboxExists(ctx, e.SandboxID)
		if err != nil {
			return err
		}
		live[e.SandboxID] = ok
	}
	var rows []activityRow
	for _, e := range entries {
		if !live[e.SandboxID] {
			continue
		}
		if e.Time.IsZero() {
			e.Time = time.Now()
		}
		a := activityRow{SandboxID: e.SandboxID, Time: e.Time, Kind: e.Kind, Actor: e.Actor, Summary: e.Summary}
		if e.Data != nil {
			d := string(e.Data)
			a.Data = &d
		}
		rows = append(rows, a)
	}
	if len(rows) == 0 {
		return nil
	}
	base, err := s.nextSeq(ctx, counterActivity, int64(len(rows)))
	if err != nil {
		return err
	}
	for i := range rows {
		rows[i].Seq = base + int64(i)
	}
	return s.writeActivity(ctx, rows, live)
}

// activityModes is what a pause or resume entry keeps of its sandbox (the
// JSON SQLite's trigger builds, field for field).
type activityModes struct {
	Requested    sandbox.PauseMode `json:"requested"`
	Mode         sandbox.PauseMode `json:"mode"`
	ResumedFrom  sandbox.PauseMode `json:"resumed_from"`
	RestoreCount int               `json:"restore_count"`
}

// eventActivityB adds ev's entry to its sandbox's timeline (SQLite's
// activity_events trigger). AppendEvent and Transition call it after the
// event is stored (a crash between leaves an event the timeline misses,
// never an entry without its event); sb is the sandbox as the event left
// it (nil: read for existence only, and a pause/resume entry goes without
// the modes).
func (s *Store) eventActivityB(ctx context.Context, ev sandbox.Event, sb *sandbox.Sandbox) error {
	if ev.SandboxID == "" {
		return nil
	}
	known := map[string]bool{}
	if sb != nil {
		known[ev.SandboxID] = true
	} else if ok, err := s.sandboxExists(ctx, ev.SandboxID); err != nil || !ok {
		return err
	}
	kind := "lifecycle"
	switch {
	case ev.Type == "transition" && ev.To == sandbox.Paused:
		kind = "pause"
	case ev.Type == "transition" && ev.To == sandbox.Running && ev.From == sandbox.Resuming:
		kind = "resume"
	case ev.Type == "reaper" || ev.Type == "reaper_failed":
		kind = "reaper"
	}
	ev.Data = cloneMap(ev.Data)
	a := activityRow{SandboxID: ev.SandboxID, Time: ev.Time, Kind: kind, Actor: ev.Actor, Event: &ev}
	// As SQLite's trigger: the modes go with a transition into paused or
	// out of resuming (a resume that failed keeps them too).
	if ev.Type == "transition" && (ev.To == sandbox.Paused || ev.From == sandbox.Resuming) && sb != nil {
		b, err := jsonString(activityModes{Requested: sb.PauseRequested, Mode: sb.PauseActual, ResumedFrom: sb.ResumedFrom,
			RestoreCount: sb.RestoreCount})
		if err != nil {
			return err
		}
		a.Data = &b
	}
	seq, err := s.nextSeq(ctx, counterActivity, 1)
	if err != nil {
		return err
	}
	a.Seq = seq
	return s.writeActivity(ctx, []activityRow{a}, known)
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (a activityRow) entry() store.ActivityEntry {
	e := store.ActivityEntry{Seq: a.Seq, SandboxID: a.SandboxID, Time: a.Time, Kind: a.Kind, Actor: a.Actor, Summary: a.Summary}
	if a.Data != nil {
		e.Data = []byte(*a.Data)
	}
	if a.Event != nil {
		ev := *a.Event
		e.Event = &ev
	}
	if a.Egress != nil {
		g := a.Egress.entry()
		e.Egress = &g
	}
	return e
}

func (s *Store) activityOf(ctx context.Context, sandboxID string) ([]activityRow, []row, error) {
	rs, err := s.list(ctx, tableActivity, map[string]string{labelSandbox: sandboxID})
	if err != nil {
		return nil, nil, err
	}
	as, kept, err := decodeRows[activityRow](rs, tableActivity)
	if err != nil {
		return nil, nil, err
	}
	idx := make([]int, 0, len(as))
	for i := range as {
		if as[i].SandboxID == sandboxID {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(i, j int) bool { return as[idx[i]].Seq < as[idx[j]].Seq })
	outA, outR := make([]activityRow, len(idx)), make([]row, len(idx))
	for i, k := range idx {
		outA[i], outR[i] = as[k], kept[k]
	}
	return outA, outR, nil
}

// ListActivity returns a sandbox's entries in ascending Seq order.
func (s *Store) ListActivity(ctx context.Context, f store.ActivityFilter) ([]store.ActivityEntry, error) {
	if f.SandboxID == "" {
		return nil, errs.Field("sandbox_id", "must not be empty")
	}
	if f.Limit < 0 {
		return nil, errs.Field("limit", "must not be negative, got %d", f.Limit)
	}
	as, _, err := s.activityOf(ctx, f.SandboxID)
	if err != nil {
		return nil, err
	}
	kinds := map[string]bool{}
	for _, k := range f.Kinds {
		kinds[k] = true
	}
	var out []store.ActivityEntry
	for _, a := range as {
		if a.Seq <= f.AfterSeq || (len(kinds) > 0 && !kinds[a.Kind]) {
			continue
		}
		out = append(out, a.entry())
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// PruneActivity keeps a sandbox's newest keep entries.
func (s *Store) PruneActivity(ctx context.Context, sandboxID string, keep int) (int64, error) {
	if keep < 1 {
		return 0, errs.Field("keep", "must be at least 1, got %d", keep)
	}
	_, rs, err := s.activityOf(ctx, sandboxID)
	if err != nil || len(rs) <= keep {
		return 0, err
	}
	old := rs[:len(rs)-keep]
	deleted := make([]bool, len(old))
	err = each(len(old), func(i int) error {
		err := s.remove(ctx, tableActivity, old[i].Spec.Key)
		if errs.Is(err, errs.NotFound) {
			return nil // a concurrent prune took it
		}
		deleted[i] = err == nil
		return err
	})
	var n int64
	for _, d := range deleted {
		if d {
			n++
		}
	}
	return n, err
}

// ActivityTouched counts per sandbox the entries after afterSeq and
// returns the largest seq. It lists only the seq buckets from afterSeq's
// to the counter's (all rows when that span is long). A number reserved
// but not yet written when it looks is counted by no later call: the
// pruner it serves bounds timelines, it need not be exact.
func (s *Store) ActivityTouched(ctx context.Context, afterSeq int64) (map[string]int64, int64, error) {
	at, err := s.counterAt(ctx, counterActivity)
	if err != nil || at <= afterSeq {
		return nil, afterSeq, err
	}
	sel := afterSel(berthv1.LabelTable+"="+tableActivity, afterSeq, at)
	rs, err := s.listSel(ctx, sel)
	if err != nil {
		return nil, 0, err
	}
	out := map[string]int64{}
	last := afterSeq
	for _, r := range rs {
		if r.Spec.Table != tableActivity || r.Spec.Seq <= afterSeq {
			continue
		}
		var a activityRow
		if err := r.decode(&a); err != nil {
			return nil, 0, err
		}
		out[a.SandboxID]++
		last = max(last, a.Seq)
	}
	if len(out) == 0 {
		return nil, afterSeq, nil
	}
	return out, last, nil
}

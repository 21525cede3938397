package kubestore

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Tables of the task ledger, notes and the audit chain.
const (
	tableTask       = "task"       // key sandbox|task id
	tableTaskChange = "taskchg"    // key sandbox|seq
	tableTaskLedger = "taskledger" // key sandbox
	tableTaskMeta   = "taskmeta"   // key sandbox: the numbers handed out
	tableNote       = "note"       // key sandbox|seq
	tableAudit      = "audit"      // key seq
	tableAuditHead  = "audithead"  // key "head"
)

type taskRow struct {
	Sandbox   string    `json:"sandbox"`
	ID        string    `json:"id"`
	Seq       int64     `json:"seq"`
	State     string    `json:"state,omitempty"`
	Brief     string    `json:"brief,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

func (t taskRow) record(withState bool) store.TaskRecord {
	r := store.TaskRecord{Sandbox: t.Sandbox, ID: t.ID, Seq: t.Seq, Brief: []byte(t.Brief), UpdatedAt: t.UpdatedAt}
	if withState && t.State != "" {
		r.State = []byte(t.State)
	}
	return r
}

type taskChangeRow struct {
	Seq     int64     `json:"seq"`
	Sandbox string    `json:"sandbox"`
	Task    string    `json:"task"`
	Time    time.Time `json:"time"`
	Actor   string    `json:"actor,omitempty"`
	Op      string    `json:"op"`
	Data    string    `json:"data,omitempty"`
}

// taskMeta numbers a sandbox's tasks and changes. Every write that takes
// numbers first writes this row, conditionally: two concurrent writers of
// one sandbox cannot hand out a number twice.
type taskMeta struct {
	Tasks   int64 `json:"tasks"`
	Changes int64 `json:"changes"`
}

func sbLabels(id string) map[string]string {
	return map[string]string{labelSandbox: id, labelWithSandbox: id}
}

// WriteTasks applies one ledger write. Without a transaction the writes
// are ordered for a crash: the numbers (taskMeta) first, then the changes
// (the log tasks are replayed from), then the tasks as they are now and
// the ledger record, which a replay of the log can rebuild.
func (s *Store) WriteTasks(ctx context.Context, w store.TaskWrite) error {
	for _, t := range w.Put {
		if t.ID == "" {
			return errs.Field("id", "a task needs an id")
		}
	}
	ok, err := s.sandboxExists(ctx, w.Sandbox)
	if err != nil {
		return err
	}
	if !ok {
		return errs.E(errs.NotFound, "sandbox %s not found", w.Sandbox)
	}
	labels := sbLabels(w.Sandbox)
	for {
		rs, err := s.listSel(ctx, tablesSel([]string{tableTask, tableTaskLedger, tableTaskMeta}, map[string]string{labelSandbox: w.Sandbox}))
		if err != nil {
			return err
		}
		tasks := map[string]row{}
		var meta taskMeta
		var metaRow, ledgerRow *row
		for i := range rs {
			r := rs[i]
			switch {
			case r.Spec.Table == tableTask:
				var t taskRow
				if err := r.decode(&t); err != nil {
					return err
				}
				if t.Sandbox == w.Sandbox {
					tasks[t.ID] = r
				}
			case r.Spec.Table == tableTaskMeta && r.Spec.Key == w.Sandbox:
				if err := r.decode(&meta); err != nil {
					return err
				}
				metaRow = &rs[i]
			case r.Spec.Table == tableTaskLedger && r.Spec.Key == w.Sandbox:
				ledgerRow = &rs[i]
			}
		}
		for _, id := range w.Delete {
			delete(tasks, id)
		}
		// Number what is new.
		before := meta
		seqOf := map[string]int64{}
		for _, t := range w.Put {
			if r, ok := tasks[t.ID]; ok {
				var old taskRow
				if err := r.decode(&old); err != nil {
					return err
				}
				seqOf[t.ID] = old.Seq
			} else if _, ok := seqOf[t.ID]; !ok {
				meta.Tasks++
				seqOf[t.ID] = meta.Tasks
			}
		}
		firstChange := meta.Changes + 1
		meta.Changes += int64(len(w.Changes))
		if meta != before {
			if metaRow == nil {
				_, err = s.create(ctx, tableTaskMeta, w.Sandbox, 0, labels, meta)
			} else {
				_, err = s.put(ctx, *metaRow, labels, meta)
			}
			if errs.Is(err, errs.Conflict) || errs.Is(err, errs.AlreadyExists) || errs.Is(err, errs.NotFound) {
				continue // another writer took numbers: count again
			}
			if err != nil {
				return err
			}
		}
		if err := each(len(w.Changes), func(i int) error {
			c := w.Changes[i]
			seq := firstChange + int64(i)
			cr := taskChangeRow{Seq: seq, Sandbox: w.Sandbox, Task: c.Task, Time: c.Time, Actor: c.Actor, Op: c.Op, Data: string(c.Data)}
			l := sbLabels(w.Sandbox)
			l[labelTask] = c.Task
			_, err := s.create(ctx, tableTaskChange, w.Sandbox+"|"+seqKey(seq), seq, l, cr)
			return err
		}); err != nil {
			return err
		}
		if err := each(len(w.Delete), func(i int) error {
			err := s.remove(ctx, tableTask, w.Sandbox+"|"+w.Delete[i])
			if errs.Is(err, errs.NotFound) {
				return nil
			}
			return err
		}); err != nil {
			return err
		}
		if err := each(len(w.Put), func(i int) error {
			t := w.Put[i]
			tr := taskRow{Sandbox: w.Sandbox, ID: t.ID, Seq: seqOf[t.ID], State: string(t.State), Brief: string(t.Brief), UpdatedAt: t.UpdatedAt}
			if r, ok := tasks[t.ID]; ok {
				_, err := s.put(ctx, r, labels, tr)
				if !errs.Is(err, errs.Conflict) {
					return err
				}
			}
			// New, or changed meanwhile: last writer wins, keeping its number.
			return s.upsert(ctx, tableTask, w.Sandbox+"|"+t.ID, 0, labels, tr)
		}); err != nil {
			return err
		}
		if w.Ledger != nil {
			l := struct {
				Data string `json:"data"`
			}{string(w.Ledger)}
			if ledgerRow != nil {
				if _, err := s.put(ctx, *ledgerRow, labels, l); err == nil {
					return nil
				} else if !errs.Is(err, errs.Conflict) {
					return err
				}
			}
			return s.upsert(ctx, tableTaskLedger, w.Sandbox, 0, labels, l)
		}
		return nil
	}
}

func (s *Store) tasksOf(ctx context.Context, sandboxID string, withState bool) ([]store.TaskRecord, error) {
	rs, err := s.list(ctx, tableTask, map[string]string{labelSandbox: sandboxID})
	if err != nil {
		return nil, err
	}
	ts, _, err := decodeRows[taskRow](rs, tableTask)
	if err != nil {
		return nil, err
	}
	out := []store.TaskRecord{}
	for _, t := range ts {
		if t.Sandbox == sandboxID {
			out = append(out, t.record(withState))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// ListTasks returns a sandbox's tasks in creation order.
func (s *Store) ListTasks(ctx context.Context, sandboxID string) ([]store.TaskRecord, error) {
	return s.tasksOf(ctx, sandboxID, true)
}

// ListTaskBriefs is ListTasks without State. (The rows are read whole:
// a row is one object.)
func (s *Store) ListTaskBriefs(ctx context.Context, sandboxID string) ([]store.TaskRecord, error) {
	return s.tasksOf(ctx, sandboxID, false)
}

// GetTask returns one task (NotFound if none).
func (s *Store) GetTask(ctx context.Context, sandboxID, taskID string) (store.TaskRecord, error) {
	var t taskRow
	if _, err := s.get(ctx, tableTask, sandboxID+"|"+taskID, &t); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.TaskRecord{}, errs.E(errs.NotFound, "task %q of sandbox %s not found", taskID, sandboxID)
		}
		return store.TaskRecord{}, err
	}
	return t.record(true), nil
}

func (s *Store) taskChanges(ctx context.Context, sandboxID, taskID string) ([]taskChangeRow, error) {
	match := map[string]string{labelSandbox: sandboxID}
	if taskID != "" {
		match[labelTask] = taskID
	}
	rs, err := s.list(ctx, tableTaskChange, match)
	if err != nil {
		return nil, err
	}
	cs, _, err := decodeRows[taskChangeRow](rs, tableTaskChange)
	if err != nil {
		return nil, err
	}
	out := cs[:0]
	for _, c := range cs {
		if c.Sandbox == sandboxID && (taskID == "" || c.Task == taskID) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// ListTaskChanges returns a sandbox's changes in the order appended.
func (s *Store) ListTaskChanges(ctx context.Context, sandboxID, taskID string, until time.Time) ([]store.TaskChange, error) {
	cs, err := s.taskChanges(ctx, sandboxID, taskID)
	if err != nil {
		return nil, err
	}
	out := []store.TaskChange{}
	for _, c := range cs {
		if until.IsZero() || !c.Time.After(until) {
			out = append(out, store.TaskChange{Seq: c.Seq, Sandbox: c.Sandbox, Task: c.Task, Time: c.Time, Actor: c.Actor, Op: c.Op, Data: []byte(c.Data)})
		}
	}
	return out, nil
}

// CountTaskChanges counts a sandbox's changes.
func (s *Store) CountTaskChanges(ctx context.Context, sandboxID string) (int, error) {
	cs, err := s.taskChanges(ctx, sandboxID, "")
	return len(cs), err
}

// GetTaskLedger returns the ledger record, nil when there is none.
func (s *Store) GetTaskLedger(ctx context.Context, sandboxID string) ([]byte, error) {
	var l struct {
		Data string `json:"data"`
	}
	if _, err := s.get(ctx, tableTaskLedger, sandboxID, &l); err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, nil
		}
		return nil, err
	}
	return []byte(l.Data), nil
}

type noteRow struct {
	Sandbox   string    `json:"sandbox"`
	Seq       int64     `json:"seq"`
	Owner     string    `json:"owner"`
	Trigger   string    `json:"trigger"`
	CreatedAt time.Time `json:"createdAt"`
	At        time.Time `json:"at"`
	Body      []byte    `json:"body"`
	Manifest  []byte    `json:"manifest,omitempty"`
}

func (n noteRow) note() store.Note {
	return store.Note{Sandbox: n.Sandbox, Seq: n.Seq, Owner: n.Owner, Trigger: n.Trigger, CreatedAt: n.CreatedAt, At: n.At,
		Body: n.Body, Manifest: n.Manifest}
}

func noteKey(id string, seq int64) string { return id + "|" + seqKey(seq) }

// notesOf returns a sandbox's notes and rows, oldest first.
func (s *Store) notesOf(ctx context.Context, sandboxID string) ([]noteRow, []row, error) {
	rs, err := s.list(ctx, tableNote, map[string]string{labelSandbox: sandboxID})
	if err != nil {
		return nil, nil, err
	}
	ns, kept, err := decodeRows[noteRow](rs, tableNote)
	if err != nil {
		return nil, nil, err
	}
	idx := []int{}
	for i := range ns {
		if ns[i].Sandbox == sandboxID {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(i, j int) bool { return ns[idx[i]].Seq < ns[idx[j]].Seq })
	outN, outR := make([]noteRow, len(idx)), make([]row, len(idx))
	for i, k := range idx {
		outN[i], outR[i] = ns[k], kept[k]
	}
	return outN, outR, nil
}

// AppendNote stores n as its sandbox's next note, then prunes. The note's
// row name is its number, so creating it is the reservation: two
// concurrent appends cannot both take one number. Pruning follows the
// insert; a crash before it leaves old notes that the next append prunes.
func (s *Store) AppendNote(ctx context.Context, n store.Note, keep, keepManifests int) (store.Note, error) {
	switch {
	case n.Sandbox == "":
		return store.Note{}, errs.Field("sandbox", "must not be empty")
	case n.Owner == "":
		return store.Note{}, errs.Field("owner", "must not be empty")
	case n.Trigger == "":
		return store.Note{}, errs.Field("trigger", "must not be empty")
	case keep < 1:
		return store.Note{}, errs.Field("keep", "must be at least 1, got %d", keep)
	}
	if n.CreatedAt.IsZero() {
		n.CreatedAt = time.Now().UTC()
	}
	if n.At.IsZero() {
		n.At = n.CreatedAt
	}
	if n.Body == nil {
		n.Body = []byte{}
	}
	labels := sbLabels(n.Sandbox)
	for {
		ns, rs, err := s.notesOf(ctx, n.Sandbox)
		if err != nil {
			return store.Note{}, err
		}
		n.Seq = 1
		if len(ns) > 0 {
			n.Seq = ns[len(ns)-1].Seq + 1
		}
		nr := noteRow{Sandbox: n.Sandbox, Seq: n.Seq, Owner: n.Owner, Trigger: n.Trigger, CreatedAt: n.CreatedAt, At: n.At,
			Body: n.Body, Manifest: n.Manifest}
		if keepManifests <= 0 {
			nr.Manifest = nil
		}
		if _, err := s.create(ctx, tableNote, noteKey(n.Sandbox, n.Seq), n.Seq, labels, nr); err != nil {
			if errs.Is(err, errs.AlreadyExists) {
				continue
			}
			return store.Note{}, err
		}
		err = each(len(ns), func(i int) error {
			old := ns[i]
			switch {
			case old.Seq <= n.Seq-int64(keep):
				if err := s.remove(ctx, tableNote, rs[i].Spec.Key); err != nil && !errs.Is(err, errs.NotFound) {
					return err
				}
			case old.Seq <= n.Seq-int64(max(keepManifests, 0)) && old.Manifest != nil:
				old.Manifest = nil
				if _, err := s.put(ctx, rs[i], labels, old); err != nil && !errs.Is(err, errs.Conflict) && !errs.Is(err, errs.NotFound) {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return store.Note{}, err
		}
		return n, nil
	}
}

// ListNotes lists a sandbox's notes newest first, at most limit (0 = all).
func (s *Store) ListNotes(ctx context.Context, sandboxID string, limit int) ([]store.Note, error) {
	ns, _, err := s.notesOf(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	var out []store.Note
	for i := len(ns) - 1; i >= 0 && (limit <= 0 || len(out) < limit); i-- {
		out = append(out, ns[i].note())
	}
	return out, nil
}

// GetNote is one note by seq (NotFound if none).
func (s *Store) GetNote(ctx context.Context, sandboxID string, seq int64) (store.Note, error) {
	var n noteRow
	if _, err := s.get(ctx, tableNote, noteKey(sandboxID, seq), &n); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.Note{}, errs.E(errs.NotFound, "note %d of sandbox %s not found", seq, sandboxID)
		}
		return store.Note{}, err
	}
	return n.note(), nil
}

// NoteAt is the newest note whose At is at or before at (NotFound if none).
func (s *Store) NoteAt(ctx context.Context, sandboxID string, at time.Time) (store.Note, error) {
	ns, _, err := s.notesOf(ctx, sandboxID)
	if err != nil {
		return store.Note{}, err
	}
	var best *noteRow
	for i := range ns {
		n := &ns[i]
		if n.At.After(at) {
			continue
		}
		if best == nil || n.At.After(best.At) || (n.At.Equal(best.At) && n.Seq > best.Seq) {
			best = n
		}
	}
	if best == nil {
		return store.Note{}, errs.E(errs.NotFound, "sandbox %s has no note at or before %s", sandboxID, at.UTC().Format(time.RFC3339))
	}
	return best.note(), nil
}

type auditRow struct {
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Actor     string    `json:"actor,omitempty"`
	Action    string    `json:"action"`
	SandboxID string    `json:"sandbox,omitempty"`
	Owner     string    `json:"owner,omitempty"`
	Data      string    `json:"data"` // the column as written (a JSON object of strings, unless forged)
	PrevHash  string    `json:"prevHash"`
	Hash      string    `json:"hash"`
	MAC       string    `json:"mac,omitempty"`
}

func (a auditRow) entry() store.AuditEntry {
	e := store.AuditEntry{Seq: a.Seq, Time: a.Time, Actor: a.Actor, Action: a.Action, SandboxID: a.SandboxID, Owner: a.Owner,
		PrevHash: a.PrevHash, Hash: a.Hash, MAC: a.MAC, DataRaw: a.Data}
	var d map[string]string
	if json.Unmarshal([]byte(a.Data), &d) == nil {
		e.Data = d
	}
	return e
}

const auditHeadKey = "head"

// AppendAudit stores entries and then the head. Each row's name is its
// seq, so an overlap fails to create (Conflict) and concurrent appenders
// cannot both continue the chain; a gap is caught against the head. A
// crash before the head is written leaves rows past it: AuditLast finds
// them, and an append that would overlap them is a Conflict.
func (s *Store) AppendAudit(ctx context.Context, entries []store.AuditEntry, head store.AuditHead) error {
	if len(entries) == 0 {
		return nil
	}
	for i, e := range entries {
		if e.Seq != entries[0].Seq+int64(i) {
			return errs.Field("seq", "audit entries must have consecutive seqs, got %d after %d", e.Seq, entries[0].Seq+int64(i)-1)
		}
	}
	if last := entries[len(entries)-1]; head.Seq != last.Seq || head.Hash != last.Hash {
		return errs.Field("head", "must be the last entry (seq %d), got seq %d", last.Seq, head.Seq)
	}
	var cur store.AuditHead
	hr, err := s.get(ctx, tableAuditHead, auditHeadKey, &cur)
	if err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	headAbsent := err != nil
	if cur.Seq+1 != entries[0].Seq {
		return errs.E(errs.Conflict, "store: audit chain ends at seq %d, cannot append seq %d", cur.Seq, entries[0].Seq)
	}
	rows := make([]auditRow, len(entries))
	for i, e := range entries {
		data := e.DataRaw
		if data == "" {
			m := e.Data
			if m == nil {
				m = map[string]string{}
			}
			b, err := json.Marshal(m)
			if err != nil {
				return errs.Wrap(errs.InvalidArgument, err, "store: audit data")
			}
			data = string(b)
		}
		rows[i] = auditRow{Seq: e.Seq, Time: e.Time, Actor: e.Actor, Action: e.Action, SandboxID: e.SandboxID, Owner: e.Owner,
			Data: data, PrevHash: e.PrevHash, Hash: e.Hash, MAC: e.MAC}
	}
	// In order: a row exists only after every row before it.
	for _, r := range rows {
		labels := map[string]string{labelSandbox: r.SandboxID, "berth.dev/owner": r.Owner, labelSeqBucket: bucketOf(r.Seq)}
		if _, err := s.create(ctx, tableAudit, seqKey(r.Seq), r.Seq, labels, r); err != nil {
			if errs.Is(err, errs.AlreadyExists) {
				return errs.E(errs.Conflict, "store: audit seq %d is already stored", r.Seq)
			}
			return err
		}
	}
	if headAbsent {
		_, err = s.create(ctx, tableAuditHead, auditHeadKey, 0, nil, head)
	} else {
		_, err = s.put(ctx, hr, nil, head)
	}
	if errs.Is(err, errs.Conflict) || errs.Is(err, errs.AlreadyExists) {
		return errs.E(errs.Conflict, "store: audit head moved while appending seq %d", entries[0].Seq)
	}
	return err
}

// AuditHead returns the stored head (NotFound before the first append).
func (s *Store) AuditHead(ctx context.Context) (store.AuditHead, error) {
	var h store.AuditHead
	if _, err := s.get(ctx, tableAuditHead, auditHeadKey, &h); err != nil {
		if errs.Is(err, errs.NotFound) {
			return store.AuditHead{}, errs.E(errs.NotFound, "audit chain has no head")
		}
		return store.AuditHead{}, err
	}
	return h, nil
}

// AuditLast returns the row with the highest seq: the head's row, or a
// row past it that an interrupted append left (probed one by one).
func (s *Store) AuditLast(ctx context.Context) (store.AuditEntry, error) {
	h, err := s.AuditHead(ctx)
	if err != nil && !errs.Is(err, errs.NotFound) {
		return store.AuditEntry{}, err
	}
	var last *auditRow
	for seq := max(h.Seq, 1); ; seq++ {
		var a auditRow
		if _, err := s.get(ctx, tableAudit, seqKey(seq), &a); err != nil {
			if errs.Is(err, errs.NotFound) {
				break
			}
			return store.AuditEntry{}, err
		}
		last = &a
	}
	if last == nil {
		return store.AuditEntry{}, errs.E(errs.NotFound, "audit chain is empty")
	}
	return last.entry(), nil
}

// ListAudit returns matching entries in ascending seq order.
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error) {
	match := map[string]string{}
	if f.SandboxID != "" {
		match[labelSandbox] = f.SandboxID
	}
	if f.Owner != "" {
		match["berth.dev/owner"] = f.Owner
	}
	sel := tablesSel([]string{tableAudit}, match)
	if f.AfterSeq > 0 {
		// The chain only grows: a verifier resuming after seq N reads the
		// buckets from N's to the head's (and the one past it, where an
		// interrupted append may have left rows).
		h, err := s.AuditHead(ctx)
		if err != nil && !errs.Is(err, errs.NotFound) {
			return nil, err
		}
		sel = afterSel(sel, f.AfterSeq, h.Seq+seqBucket)
	}
	rs, err := s.listSel(ctx, sel)
	if err != nil {
		return nil, err
	}
	as, _, err := decodeRows[auditRow](rs, tableAudit)
	if err != nil {
		return nil, err
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Seq < as[j].Seq })
	var out []store.AuditEntry
	for _, a := range as {
		if a.Seq <= f.AfterSeq || (!f.Since.IsZero() && a.Time.Before(f.Since)) ||
			(f.SandboxID != "" && a.SandboxID != f.SandboxID) || (f.Owner != "" && a.Owner != f.Owner) {
			continue
		}
		out = append(out, a.entry())
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Package kubestore is store.Store on the Kubernetes API: cluster mode's
// state lives in berth.dev/v1alpha1 objects of one namespace. Sandboxes and
// templates are first-class objects (kubectl get sandboxes); every other
// table's rows are Records (berth.dev_records.yaml), one object per row,
// selected by labels. It passes storetest.TestStore, the suite SQLite passes.
//
// Kubernetes has no transaction across objects. Every single-row change is
// one conditional write (resourceVersion), so concurrent writers never lose
// an update; where the SQLite store changes two tables at once (a state
// change and its event) this store writes the row first and the dependent
// row after, and the order is chosen so a crash between them leaves what a
// reader can act on (a state without its event, never an event without
// its state).
//
// What stands in for SQLite's constraints and triggers:
//   - a unique field other than the key is a record keyed by it: an API
//     key's hash keys the key's own record (its id another); a snapshot's
//     name per owner, a checkpoint's per sandbox and one open merge per
//     target are claim records (claim), taken over when the row holding
//     them is gone, so a crash between two writes never blocks a name;
//   - ON DELETE CASCADE is the label LabelCascade: DeleteSandbox removes
//     every record carrying the sandbox's id in one DeleteCollection;
//   - a sequence is a counter record stepped by a conditional PUT
//     (nextSeq), whose last version each process caches;
//   - what a trigger on events did happens in eventStored, after the
//     event's record is written.
package kubestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/lazyregexp"
)

// Store is the Kubernetes-backed store of one namespace.
type Store struct {
	kc  *kube.Client
	ns  string
	now func() time.Time

	// seqs caches each counter's record as last written by this process,
	// so a counter step is one conditional PUT while this replica is the
	// only writer (a Conflict falls back to GET + PUT).
	seqMu sync.Mutex
	seqs  map[string]berthv1.Record
}

// LabelCascade marks a record that belongs to a sandbox (its value is the
// sandbox id in LabelValue form): DeleteSandbox removes every record
// carrying it in one DeleteCollection, which is what SQLite's ON DELETE
// CASCADE and the store's delete-time triggers do. Events do not carry it
// (they outlive their sandbox).
const LabelCascade = "berth.dev/with-sandbox"

// ownedBy returns labels plus the cascade label of sandbox id.
func ownedBy(id string, labels map[string]string) map[string]string {
	out := map[string]string{LabelCascade: id}
	for k, v := range labels {
		out[k] = v
	}
	return out
}

// Open returns the store of namespace ns (the CRDs must be installed).
func Open(ctx context.Context, kc *kube.Client, ns string) (*Store, error) {
	s := &Store{kc: kc, ns: ns, now: time.Now, seqs: map[string]berthv1.Record{}}
	var l berthv1.RecordList
	if err := kc.List(ctx, berthv1.Records, ns, kube.ListOptions{Limit: 1}, &l); err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "kubernetes store: are the berth.dev CRDs installed (deploy/crds)?")
	}
	return s, nil
}

// Close releases nothing: the API server holds the state.
func (s *Store) Close() error { return nil }

var labelValueRe = lazyregexp.New(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

// LabelValue is v in a form a label value may take: v itself when it is
// one (≤ 63 characters of the allowed set), else "h." and a hash. Selecting
// by it may match a hash collision's row in theory; callers compare the
// real field after listing.
func LabelValue(v string) string {
	if len(v) <= 63 && labelValueRe.MatchString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "h." + hex.EncodeToString(sum[:])[:40]
}

// objectName is the DNS-safe name of table's row key.
func objectName(table, key string) string {
	sum := sha256.Sum256([]byte(key))
	return table + "-" + hex.EncodeToString(sum[:])[:40]
}

// row is one record as read: its decoded spec and version.
type row struct {
	berthv1.Record
}

func (r row) decode(v any) error {
	if err := json.Unmarshal([]byte(r.Spec.Data), v); err != nil {
		return errs.Wrap(errs.Internal, err, "kubernetes store: record %s", r.Name)
	}
	return nil
}

func (s *Store) record(table, key string, seq int64, labels map[string]string, v any) (*berthv1.Record, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "kubernetes store: encode %s", table)
	}
	l := map[string]string{berthv1.LabelTable: table}
	for k, v := range labels {
		l[k] = LabelValue(v)
	}
	return &berthv1.Record{
		TypeMeta:   kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Record"},
		ObjectMeta: kube.ObjectMeta{Name: objectName(table, key), Namespace: s.ns, Labels: l},
		Spec:       berthv1.RecordSpec{Table: table, Key: key, Seq: seq, Data: string(b)},
	}, nil
}

// insert creates table's row key; AlreadyExists when it is there.
// labels are selectable fields ("berth.dev/..." or short names).
func (s *Store) insert(ctx context.Context, table, key string, seq int64, labels map[string]string, v any) error {
	rec, err := s.record(table, key, seq, labels, v)
	if err != nil {
		return err
	}
	return s.kc.Create(ctx, berthv1.Records, s.ns, rec, nil)
}

// upsert creates or replaces the row (last writer wins).
func (s *Store) upsert(ctx context.Context, table, key string, seq int64, labels map[string]string, v any) error {
	for {
		err := s.insert(ctx, table, key, seq, labels, v)
		if !errs.Is(err, errs.AlreadyExists) {
			return err
		}
		var cur berthv1.Record
		if err := s.kc.Get(ctx, berthv1.Records, s.ns, objectName(table, key), &cur); err != nil {
			if errs.Is(err, errs.NotFound) {
				continue
			}
			return err
		}
		rec, err := s.record(table, key, seq, labels, v)
		if err != nil {
			return err
		}
		rec.ResourceVersion = cur.ResourceVersion
		err = s.kc.Update(ctx, berthv1.Records, s.ns, rec.Name, rec, nil)
		if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
			continue
		}
		return err
	}
}

// get reads table's row key into v (NotFound when absent).
func (s *Store) get(ctx context.Context, table, key string, v any) (row, error) {
	var r row
	if err := s.kc.Get(ctx, berthv1.Records, s.ns, objectName(table, key), &r.Record); err != nil {
		return row{}, err
	}
	if r.Spec.Table != table || r.Spec.Key != key {
		return row{}, errs.E(errs.NotFound, "%s %q not found", table, key)
	}
	return r, r.decode(v)
}

// update reads the row, lets fn change v, and writes it back if the row did
// not change meanwhile (else it retries: fn must be free of side effects).
// fn's error is returned as is and nothing is written.
func (s *Store) update(ctx context.Context, table, key string, v any, labels func() map[string]string, fn func() error) error {
	for {
		r, err := s.get(ctx, table, key, v)
		if err != nil {
			return err
		}
		if err := fn(); err != nil {
			return err
		}
		rec, err := s.record(table, key, r.Spec.Seq, labels(), v)
		if err != nil {
			return err
		}
		rec.ResourceVersion = r.ResourceVersion
		err = s.kc.Update(ctx, berthv1.Records, s.ns, rec.Name, rec, nil)
		if errs.Is(err, errs.Conflict) {
			continue
		}
		return err
	}
}

// remove deletes the row (NotFound when absent).
func (s *Store) remove(ctx context.Context, table, key string) error {
	return s.kc.Delete(ctx, berthv1.Records, s.ns, objectName(table, key), kube.DeleteOptions{})
}

// list returns every row of table matching the label pairs (values in
// LabelValue form are derived here), in no particular order: callers
// sort. Pages through the whole collection.
func (s *Store) list(ctx context.Context, table string, match map[string]string) ([]row, error) {
	sel := berthv1.LabelTable + "=" + table
	for k, v := range match {
		sel += "," + k + "=" + LabelValue(v)
	}
	var out []row
	opts := kube.ListOptions{LabelSelector: sel, Limit: 500}
	for {
		var l berthv1.RecordList
		if err := s.kc.List(ctx, berthv1.Records, s.ns, opts, &l); err != nil {
			return nil, err
		}
		for _, it := range l.Items {
			if it.Spec.Table == table {
				out = append(out, row{it})
			}
		}
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

// nextSeq reserves n sequence numbers of counter and returns the first:
// numbers increase and are never handed out twice, even to concurrent
// writers (a conditional update of the counter's row).
func (s *Store) nextSeq(ctx context.Context, counter string, n int64) (int64, error) {
	return s.nextSeqOwned(ctx, counter, n, nil)
}

// nextSeqOwned is nextSeq whose counter row, when it is created, carries
// labels (ownedBy: a per-sandbox counter goes with its sandbox).
func (s *Store) nextSeqOwned(ctx context.Context, counter string, n int64, labels map[string]string) (int64, error) {
	s.seqMu.Lock()
	cur, cached := s.seqs[counter]
	s.seqMu.Unlock()
	for {
		if !cached {
			err := s.kc.Get(ctx, berthv1.Records, s.ns, objectName("seq", counter), &cur)
			if errs.Is(err, errs.NotFound) {
				rec, _ := s.record("seq", counter, n, labels, n)
				var out berthv1.Record
				err := s.kc.Create(ctx, berthv1.Records, s.ns, rec, &out)
				if err == nil {
					s.cacheSeq(counter, out)
					return 1, nil
				}
				if errs.Is(err, errs.AlreadyExists) {
					continue
				}
				return 0, err
			}
			if err != nil {
				return 0, err
			}
		}
		last := cur.Spec.Seq
		next := cur
		next.Spec.Seq = last + n
		next.Spec.Data = strconv.FormatInt(last+n, 10)
		var out berthv1.Record
		err := s.kc.Update(ctx, berthv1.Records, s.ns, cur.Name, &next, &out)
		if errs.Is(err, errs.Conflict) || (cached && errs.Is(err, errs.NotFound)) {
			cached = false
			continue
		}
		if err != nil {
			return 0, err
		}
		s.cacheSeq(counter, out)
		return last + 1, nil
	}
}

func (s *Store) cacheSeq(counter string, r berthv1.Record) {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	s.seqs[counter] = r
}

// claim makes table's row key name holder, a uniqueness constraint across
// records (a snapshot name of an owner, one open merge of a target). A row
// already held by holder is fine; one held by another is AlreadyExists
// unless stale(other) says the holder is gone (a crash between the writes
// that make and undo a claim), in which case it is taken over.
func (s *Store) claim(ctx context.Context, table, key, holder string, labels map[string]string, stale func(other string) (bool, error)) error {
	for {
		err := s.insert(ctx, table, key, 0, labels, holder)
		if !errs.Is(err, errs.AlreadyExists) {
			return err
		}
		var other string
		r, err := s.get(ctx, table, key, &other)
		if errs.Is(err, errs.NotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if other == holder {
			return nil
		}
		gone := false
		if stale != nil {
			if gone, err = stale(other); err != nil {
				return err
			}
		}
		if !gone {
			return errs.E(errs.AlreadyExists, "%s %q is taken", table, key)
		}
		rec, err := s.record(table, key, 0, labels, holder)
		if err != nil {
			return err
		}
		rec.ResourceVersion = r.ResourceVersion
		err = s.kc.Update(ctx, berthv1.Records, s.ns, rec.Name, rec, nil)
		if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
			continue
		}
		return err
	}
}

// release removes table's row key if holder still holds it.
func (s *Store) release(ctx context.Context, table, key, holder string) error {
	var other string
	r, err := s.get(ctx, table, key, &other)
	if errs.Is(err, errs.NotFound) || (err == nil && other != holder) {
		return nil
	}
	if err != nil {
		return err
	}
	err = s.kc.Delete(ctx, berthv1.Records, s.ns, r.Name, kube.DeleteOptions{ResourceVersion: r.ResourceVersion})
	if errs.Is(err, errs.NotFound) || errs.Is(err, errs.Conflict) {
		return nil // gone, or taken over by a newer holder
	}
	return err
}

// pairKey is an unambiguous row key of two strings (owner and name, ...).
func pairKey(a, b string) string {
	k, _ := json.Marshal([]string{a, b})
	return string(k)
}

// replace writes v over the row r as read (its table, key and seq),
// conditional on r's resourceVersion: Conflict when it changed since.
func (s *Store) replace(ctx context.Context, r row, labels map[string]string, v any) error {
	rec, err := s.record(r.Spec.Table, r.Spec.Key, r.Spec.Seq, labels, v)
	if err != nil {
		return err
	}
	rec.ResourceVersion = r.ResourceVersion
	return s.kc.Update(ctx, berthv1.Records, s.ns, rec.Name, rec, nil)
}

package kubestore

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
)

// Labels of the rows of metering.go and ledgers*.go.
const (
	// labelSandbox selects a row by the sandbox it belongs to.
	labelSandbox = "berth.dev/sandbox"
	// labelWithSandbox marks a row that goes with its sandbox: DeleteSandbox
	// removes every row carrying its id here in one DeleteCollection.
	labelWithSandbox = "berth.dev/with-sandbox"
	// labelSeqBucket is seq/seqBucket of a numbered row (activity, egress,
	// audit): a read "after seq N" selects the buckets from N's to the
	// newest instead of listing the whole table (a label selector has no
	// range operator, but it has "in").
	labelSeqBucket = "berth.dev/seqk"
	labelLineage   = "berth.dev/lineage"
	labelIdemKey   = "berth.dev/idem-key"
	labelIdentity  = "berth.dev/identity"
	labelPlaceh    = "berth.dev/placeholder"
	labelTask      = "berth.dev/task"
)

// deleteSandboxRowsB removes the rows of metering.go and ledgers*.go that go
// with sandbox id (activity, tasks, notes, leases). DeleteSandbox calls it
// after the Sandbox object is gone: a writer that checked the sandbox
// before then re-checks after its write (dropSandboxRows), so whichever
// runs last removes a late row.
func (s *Store) deleteSandboxRowsB(ctx context.Context, id string) error {
	return s.kc.DeleteCollection(ctx, berthv1.Records, s.ns, kube.ListOptions{LabelSelector: labelWithSandbox + "=" + LabelValue(id)})
}

// sandboxExists reads the Sandbox object (existence only: kstore-a maps it).
func (s *Store) sandboxExists(ctx context.Context, id string) (bool, error) {
	var sb berthv1.Sandbox
	err := s.kc.Get(ctx, berthv1.Sandboxes, s.ns, id, &sb)
	if errs.Is(err, errs.NotFound) {
		return false, nil
	}
	return err == nil, err
}

// listSel lists the rows matching a raw label selector, paging through.
func (s *Store) listSel(ctx context.Context, sel string) ([]row, error) {
	var out []row
	opts := kube.ListOptions{LabelSelector: sel, Limit: 500}
	for {
		var l berthv1.RecordList
		if err := s.kc.List(ctx, berthv1.Records, s.ns, opts, &l); err != nil {
			return nil, err
		}
		for _, it := range l.Items {
			out = append(out, row{it})
		}
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

// maxRowBytes bounds a row's data: etcd refuses a write over 1.5 MiB (by
// default) with an error that reads like an outage; this one says what.
const maxRowBytes = 1 << 20

// checked is s.record refusing a row too large for one object.
func (s *Store) checked(table, key string, seq int64, labels map[string]string, v any) (*berthv1.Record, error) {
	rec, err := s.record(table, key, seq, labels, v)
	if err != nil {
		return nil, err
	}
	if n := len(rec.Spec.Data); n > maxRowBytes {
		return nil, errs.E(errs.ResourceExhausted, "kubernetes store: a %s row of %d bytes is over the %d one object may hold", table, n, maxRowBytes)
	}
	return rec, nil
}

// create creates the row and returns it as stored (its resourceVersion).
func (s *Store) create(ctx context.Context, table, key string, seq int64, labels map[string]string, v any) (*berthv1.Record, error) {
	rec, err := s.checked(table, key, seq, labels, v)
	if err != nil {
		return nil, err
	}
	var out berthv1.Record
	if err := s.kc.Create(ctx, berthv1.Records, s.ns, rec, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// put writes v over the row r read before (conditional on its version:
// Conflict when it changed) and returns the row as stored.
func (s *Store) put(ctx context.Context, r row, labels map[string]string, v any) (*berthv1.Record, error) {
	rec, err := s.checked(r.Spec.Table, r.Spec.Key, r.Spec.Seq, labels, v)
	if err != nil {
		return nil, err
	}
	rec.ResourceVersion = r.ResourceVersion
	var out berthv1.Record
	if err := s.kc.Update(ctx, berthv1.Records, s.ns, rec.Name, rec, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// mutate is update that creates the row when it is absent: fn changes v
// (the zero value when absent) and may run more than once.
func (s *Store) mutate(ctx context.Context, table, key string, labels map[string]string, v any, reset func(), fn func() error) error {
	for {
		reset()
		r, err := s.get(ctx, table, key, v)
		if err != nil && !errs.Is(err, errs.NotFound) {
			return err
		}
		absent := err != nil
		if absent {
			reset()
		}
		if err := fn(); err != nil {
			return err
		}
		if absent {
			_, err = s.create(ctx, table, key, 0, labels, v)
			if errs.Is(err, errs.AlreadyExists) {
				continue
			}
			return err
		}
		_, err = s.put(ctx, r, labels, v)
		if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
			continue
		}
		return err
	}
}

// each runs fn(0..n-1) with a few requests in flight (the API server
// answers them in parallel; one at a time would make a batch n round trips
// long) and returns the first error.
func each(n int, fn func(i int) error) error {
	const inFlight = 8
	if n <= 1 {
		if n == 1 {
			return fn(0)
		}
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, inFlight)
	)
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// undo is a stack of compensating steps: where SQLite rolls a transaction
// back, these writes are reverted one by one, newest first, detached from
// the caller's context (a cancelled request must not stop its own undo).
type undo struct {
	mu    sync.Mutex
	steps []func(ctx context.Context)
}

func (u *undo) push(f func(ctx context.Context)) {
	u.mu.Lock()
	u.steps = append(u.steps, f)
	u.mu.Unlock()
}

func (u *undo) run(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for i := len(u.steps) - 1; i >= 0; i-- {
		u.steps[i](ctx)
	}
	u.steps = nil
}

// deleteRow removes a row this call created (undo), if still unchanged.
func (s *Store) deleteRow(ctx context.Context, rec *berthv1.Record) {
	_ = s.kc.Delete(ctx, berthv1.Records, s.ns, rec.Name, kube.DeleteOptions{ResourceVersion: rec.ResourceVersion})
}

// seqKey is the row key of a sequence number (sorts like the number).
func seqKey(seq int64) string { return strconv.FormatInt(seq, 10) }

// decodeRows decodes every row of table among rs into T, skipping rows of
// other tables (a selector may span several).
func decodeRows[T any](rs []row, table string) ([]T, []row, error) {
	var out []T
	var kept []row
	for _, r := range rs {
		if r.Spec.Table != table {
			continue
		}
		var v T
		if err := r.decode(&v); err != nil {
			return nil, nil, err
		}
		out = append(out, v)
		kept = append(kept, r)
	}
	return out, kept, nil
}

// tablesSel is a selector over several tables and label pairs.
func tablesSel(tables []string, match map[string]string) string {
	sel := berthv1.LabelTable + " in (" + strings.Join(tables, ",") + ")"
	keys := make([]string, 0, len(match))
	for k := range match {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sel += "," + k + "=" + LabelValue(match[k])
	}
	return sel
}

// jsonString is v's JSON as a string.
func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "kubernetes store: encode")
	}
	return string(b), nil
}

// seqBucket is how many numbers share a labelSeqBucket value.
const seqBucket = 1024

func bucketOf(seq int64) string { return strconv.FormatInt(seq/seqBucket, 10) }

// afterSel narrows sel to the buckets holding seqs in (after, last], or
// leaves it whole when that span is long (or after is 0: everything).
func afterSel(sel string, after, last int64) string {
	from, to := max(after, 0)/seqBucket, last/seqBucket
	if after <= 0 || to-from >= 64 {
		return sel
	}
	var bs []string
	for b := from; b <= to; b++ {
		bs = append(bs, strconv.FormatInt(b, 10))
	}
	return sel + "," + labelSeqBucket + " in (" + strings.Join(bs, ",") + ")"
}

// counterAt is the last number counter handed out (0 before the first).
func (s *Store) counterAt(ctx context.Context, counter string) (int64, error) {
	var ctr berthv1.Record
	err := s.kc.Get(ctx, berthv1.Records, s.ns, objectName("seq", counter), &ctr)
	if errs.Is(err, errs.NotFound) {
		return 0, nil
	}
	return ctr.Spec.Seq, err
}

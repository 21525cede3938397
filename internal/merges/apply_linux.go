package merges

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/lineage"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// views are the three trees of a merge (lineage views, closed together).
type views struct {
	base, ours, theirs *fsdiff.Tree
	open               []lineage.View
}

func (v *views) Close() {
	for _, l := range v.open {
		_ = l.Close()
	}
}

// oursTree is the target's live view: its upper (owners as seen inside)
// over its lowers.
func (s *Service) oursTree(ctx context.Context, v *views, target *sandbox.Sandbox) (*fsdiff.Tree, error) {
	lv, err := s.core.View(ctx, target)
	if err != nil {
		return nil, err
	}
	v.open = append(v.open, lv)
	return lv.Tree, nil
}

func (s *Service) stackTree(v *views, layers []string) (*fsdiff.Tree, error) {
	lv, err := s.core.LayersView(layers)
	if err != nil {
		return nil, err
	}
	v.open = append(v.open, lv)
	return lv.Tree, nil
}

// openViews opens base (the fork point's layers), theirs (the source's
// capture) and, unless target is nil, ours (the target's live view: on
// runsc an export of the upper, so the apply, which reads only base and
// theirs, leaves it out).
func (s *Service) openViews(ctx context.Context, target *sandbox.Sandbox, base, theirs []string) (*views, error) {
	v := &views{}
	var err error
	if v.base, err = s.stackTree(v, base); err == nil {
		if v.theirs, err = s.stackTree(v, theirs); err == nil && target != nil {
			v.ours, err = s.oursTree(ctx, v, target)
		}
	}
	if err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// applyStored re-opens the views of a stored merge and applies its plan.
func (s *Service) applyStored(ctx context.Context, target *sandbox.Sandbox, m store.Merge, plan *merge.Plan, actor string) (Merge, error) {
	if err := writable(target); err != nil {
		return Merge{}, err
	}
	now := time.Now()
	return s.applyLocked(ctx, target, m, plan, actor, now, newClock(now))
}

// maxAttempts bounds re-planning when the target changed under a plan.
const maxAttempts = 3

// applyLocked applies a clean plan to the target (its lock held): staged
// while it runs, verified and committed while it is frozen. When the
// target moved on since the plan, the merge is planned again (stored
// resolutions carry over by conflict id), at most maxAttempts times.
func (s *Service) applyLocked(ctx context.Context, target *sandbox.Sandbox, m store.Merge, plan *merge.Plan, actor string, start time.Time, clk *clock) (Merge, error) {
	var doc planDoc
	_ = json.Unmarshal(m.Plan, &doc)
	baseLayers := doc.Base
	if len(baseLayers) == 0 {
		base, err := s.core.Store().GetSnapshot(ctx, m.BaseSnapshot)
		if err != nil {
			return Merge{}, errs.Wrap(errs.FailedPrecondition, err, "fork point %s of merge %s", m.BaseSnapshot, m.ID)
		}
		baseLayers = base.Layers
	}
	capt, err := s.core.Store().GetSnapshot(ctx, m.SourceSnapshot)
	if err != nil {
		return Merge{}, errs.Wrap(errs.FailedPrecondition, err, "capture %s of merge %s", m.SourceSnapshot, m.ID)
	}
	var res Result
	for attempt := 1; ; attempt++ {
		res, err = s.applyOnce(ctx, target, m, plan, baseLayers, capt.Layers, clk)
		if !errs.Is(err, errs.Conflict) || attempt == maxAttempts {
			break
		}
		s.log.Info("target changed under the merge; planning again", "sandbox_id", target.ID, "merge", m.ID, "attempt", attempt, "err", err)
		if plan, err = s.replan(ctx, target, m, baseLayers, capt.Layers); err != nil {
			break
		}
		clk.mark("plan")
		if !plan.Clean() {
			// New conflicts: store them and wait for resolution.
			return s.reconflict(ctx, target, m, plan)
		}
	}
	if err != nil {
		if errs.Is(err, errs.Conflict) {
			err = errs.Reclassify(errs.Conflict, err, "target %s keeps changing; merge %s not applied", target.ID, m.ID)
		}
		s.core.Event(ctx, target, actor, "merge", "merge_failed", errs.Short(err), map[string]string{"merge": m.ID, "source": m.Source})
		return Merge{}, err
	}
	// The store phase ends with the applied row: measured up to its write,
	// which carries the figures.
	clk.mark("store")
	res.Ms = time.Since(start).Milliseconds()
	res.Phases = clk.phases()
	s.log.Info("merge applied", "sandbox_id", target.ID, "merge", m.ID, "writes", res.Writes, "deletes", res.Deletes, "ms", res.Ms,
		"phases_ms", res.Phases)
	if err := s.finish(ctx, &m, store.MergeApplied, "", &res); err != nil {
		return Merge{}, err
	}
	_ = os.RemoveAll(s.journalDir(m.ID))
	s.core.Event(ctx, target, actor, "merge", "merge_applied", "", res.Phases.eventData(map[string]string{
		"merge": m.ID, "source": m.Source, "base": m.BaseSnapshot, "strategy": m.Strategy,
		"writes": itoa(res.Writes), "deletes": itoa(res.Deletes), "open_files": itoa(len(res.OpenFiles)), "ms": formatInt(res.Ms)}))
	return s.view(ctx, m)
}

// replan computes the merge again against the target as it is now and
// re-applies the stored resolutions whose conflicts come up again.
func (s *Service) replan(ctx context.Context, target *sandbox.Sandbox, m store.Merge, base, theirs []string) (*merge.Plan, error) {
	var doc planDoc
	_ = json.Unmarshal(m.Plan, &doc)
	v, err := s.openViews(ctx, target, base, theirs)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	plan, err := merge.Compute(ctx, merge.Inputs{Base: v.base, Ours: v.ours, Theirs: v.theirs},
		merge.Options{Strategy: merge.Strategy(m.Strategy), Paths: doc.Paths})
	if err != nil {
		return nil, err
	}
	plan = withoutPrivate(plan)
	rows, err := s.core.Store().ListMergeConflicts(ctx, m.ID)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		var res merge.Resolution
		if len(r.Resolution) == 0 || json.Unmarshal(r.Resolution, &res) != nil {
			continue
		}
		if err := plan.Resolve(r.ID, res); err != nil && !errs.Is(err, errs.NotFound) {
			return nil, err
		}
	}
	return plan, nil
}

// reconflict replaces an open merge by a new one with the conflicts of a
// fresh plan (the old one is aborted with reason replanned).
func (s *Service) reconflict(ctx context.Context, target *sandbox.Sandbox, m store.Merge, plan *merge.Plan) (Merge, error) {
	var doc planDoc
	_ = json.Unmarshal(m.Plan, &doc)
	m.State, m.Reason, m.UpdatedAt = store.MergeAborted, "replanned", s.core.Now().UTC()
	if err := s.core.Store().UpdateMerge(ctx, m); err != nil {
		return Merge{}, err
	}
	n := m
	n.ID, n.State, n.Reason, n.CreatedAt, n.UpdatedAt = sandbox.NewID(), store.MergeConflicted, "", s.core.Now().UTC(), time.Time{}
	if err := s.create(ctx, &n, plan, doc.planMeta); err != nil {
		return Merge{}, err
	}
	return s.view(ctx, n)
}

// applyOnce stages, freezes, verifies and commits one plan.
func (s *Service) applyOnce(ctx context.Context, target *sandbox.Sandbox, m store.Merge, plan *merge.Plan, base, theirs []string, clk *clock) (Result, error) {
	if target.Runtime == "runsc" {
		return s.applyAgent(ctx, target, m, plan, base, theirs, clk)
	}
	rt, err := s.core.RuntimeFor(target)
	if err != nil {
		return Result{}, err
	}
	v, err := s.openViews(ctx, nil, base, theirs)
	if err != nil {
		return Result{}, err
	}
	defer v.Close()
	root := rootfs.LayoutOf(s.core.SandboxDir(target.ID)).RootFS
	if ok, err := isMountPoint(root); err != nil || !ok {
		return Result{}, errs.E(errs.FailedPrecondition, "the root filesystem of %s is not mounted", target.ID)
	}
	res := Result{Writes: len(plan.Writes), Deletes: len(plan.Deletes)}
	frozen := false
	thaw := func() {
		if frozen {
			frozen = false
			if err := rt.Thaw(context.WithoutCancel(ctx), target.ID); err != nil {
				s.log.Error("thaw after merge", "sandbox_id", target.ID, "merge", m.ID, "err", err)
			}
		}
	}
	defer thaw()
	// The init's pid (for the open files) is asked of the runtime while
	// the stage runs: one runtime process off the critical path.
	type stateResult struct {
		st  runtime.Status
		err error
	}
	stateCh := make(chan stateResult, 1)
	go func() {
		st, err := rt.State(ctx, target.ID)
		stateCh <- stateResult{st, err}
	}()
	saved := ""
	opts := merge.ApplyOptions{
		Save: func(j *merge.Journal) error {
			switch j.State { // the phase that ends with this save
			case merge.JournalPrepared:
				clk.mark("prepare")
			case merge.JournalCommitted, merge.JournalRolledBack:
				clk.mark("commit")
			}
			err := s.saveJournal(j, target.ID)
			clk.mark("journal")
			if err == nil {
				saved = j.State
			}
			if err == nil && j.State == merge.JournalCommitted {
				// Durably committed: the target runs again while the
				// staging dir (the old objects) is removed.
				thaw()
				clk.mark("finish")
			}
			return err
		},
		BeforeCommit: func() error {
			clk.mark("stage")
			sr := <-stateCh
			if sr.err != nil {
				return sr.err
			}
			st := sr.st
			if rt.Capabilities(ctx).Freeze {
				if err := rt.Freeze(ctx, target.ID); err != nil {
					return errs.Wrap(errs.Internal, err, "freeze %s for the merge", target.ID)
				}
				frozen = true
			}
			clk.mark("freeze")
			fresh := &views{}
			defer fresh.Close()
			ours, err := s.oursTree(ctx, fresh, target)
			if err != nil {
				return err
			}
			if err := merge.Verify(plan, ours); err != nil {
				thaw()
				return err
			}
			res.OpenFiles = openFiles(st.Pid, plan.Touched())
			clk.mark("verify")
			return nil
		},
	}
	if d := s.cfg.PauseAfterStep; d > 0 {
		opts.AfterStep = func(done int) {
			if done == 1 {
				s.log.Warn("merge paused for a test (BERTH_TEST_MERGE_PAUSE)", "sandbox_id", target.ID, "merge", m.ID, "steps", len(plan.Writes)+len(plan.Deletes))
				time.Sleep(d)
			}
		}
	}
	err = merge.Apply(ctx, root, shifted(plan, s.core.UserNS(target)), merge.Sources{merge.SideTheirs: v.theirs, merge.SideBase: v.base}, m.ID, opts)
	clk.mark("finish")
	if err != nil && (saved == merge.JournalPrepared || saved == merge.JournalRolledBack) {
		// Nothing of the target changed (or it was put back): no journal
		// to recover. A commit that could not roll back keeps it.
		_ = os.RemoveAll(s.journalDir(m.ID))
	}
	return res, err
}

// shifted is plan with owners as the host writes them for a sandbox in a
// user namespace (the plan holds the ids seen inside).
func shifted(p *merge.Plan, m *rootfs.IDMap) *merge.Plan {
	if m == nil {
		return p
	}
	shift := func(id uint32) uint32 {
		if id < m.Size {
			return m.HostID + id
		}
		return 65534
	}
	node := func(n *fsdiff.Node) *fsdiff.Node {
		if n == nil {
			return nil
		}
		c := *n
		c.UID, c.GID = shift(c.UID), shift(c.GID)
		return &c
	}
	out := *p
	out.Writes = make([]merge.Write, len(p.Writes))
	for i, w := range p.Writes {
		w.Node = *node(&w.Node)
		w.Expect = node(w.Expect)
		out.Writes[i] = w
	}
	out.Deletes = make([]merge.Delete, len(p.Deletes))
	for i, d := range p.Deletes {
		d.Expect = node(d.Expect)
		out.Deletes[i] = d
	}
	return &out
}

// journalFile is what the daemon keeps of an apply in progress.
type journalFile struct {
	Target  string         `json:"target"`
	Journal *merge.Journal `json:"journal"`
}

// saveJournal writes the journal durably: a synced temporary file renamed
// over the old one, then the directory synced.
func (s *Service) saveJournal(j *merge.Journal, target string) error {
	dir := s.journalDir(j.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "merge journal dir")
	}
	b, err := json.Marshal(journalFile{Target: target, Journal: j})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode merge journal")
	}
	tmp := filepath.Join(dir, "journal.json.tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write merge journal")
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, "journal.json"))
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(dir); err == nil {
			err = errors.Join(d.Sync(), d.Close())
		}
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "write merge journal")
	}
	return nil
}

// Recover finishes merges a crash interrupted (daemon start, before the
// sandboxes are reconciled): a commit in progress is rolled back so the
// target is as it was, a target frozen for it is thawed, and the merge is
// aborted with reason interrupted; a finished commit is recorded applied.
func (s *Service) Recover(ctx context.Context) error {
	entries, err := os.ReadDir(filepath.Join(s.cfg.DataDir, "merges"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "list merge journals")
	}
	var errList []error
	for _, e := range entries {
		if !sandbox.ValidID(e.Name()) {
			continue
		}
		if err := s.recoverOne(ctx, e.Name()); err != nil {
			s.log.Error("recover merge", "merge", e.Name(), "err", err)
			errList = append(errList, err)
		}
	}
	return errors.Join(errList...)
}

func (s *Service) recoverOne(ctx context.Context, mid string) error {
	dir := s.journalDir(mid)
	b, err := os.ReadFile(filepath.Join(dir, "journal.json"))
	if errors.Is(err, os.ErrNotExist) {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "read merge journal %s", mid)
	}
	var jf journalFile
	if err := json.Unmarshal(b, &jf); err != nil || jf.Journal == nil || jf.Journal.ID != mid {
		return errs.E(errs.Internal, "merge journal %s is unreadable", mid)
	}
	m, err := s.core.Store().GetMerge(ctx, mid)
	if errs.Is(err, errs.NotFound) { // the target went, and its tree with it
		return os.RemoveAll(dir)
	}
	if err != nil {
		return err
	}
	target, err := s.core.Store().GetSandbox(ctx, m.Target)
	if errs.Is(err, errs.NotFound) {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return err
	}
	j := jf.Journal
	committed := j.State == merge.JournalCommitted
	if target.Runtime == "runsc" {
		if err := s.recoverAgent(ctx, target, j); err != nil {
			return err
		}
	} else {
		root := rootfs.LayoutOf(s.core.SandboxDir(target.ID)).RootFS
		if ok, err := isMountPoint(root); err != nil || !ok {
			return errs.E(errs.FailedPrecondition, "merge %s: the root filesystem of %s is not mounted; the journal is kept", mid, target.ID)
		}
		if err := merge.Recover(root, j); err != nil {
			return err
		}
	}
	// The merge froze the target; the target's own state says running.
	if rt, err := s.core.RuntimeFor(target); err == nil && target.State == sandbox.Running && target.Runtime != "runsc" {
		if st, err := rt.State(ctx, target.ID); err == nil && st.State == "paused" {
			if err := rt.Thaw(ctx, target.ID); err != nil {
				s.log.Error("thaw after an interrupted merge", "sandbox_id", target.ID, "merge", mid, "err", err)
			}
		}
	}
	if m.Open() {
		state, reason := store.MergeAborted, "interrupted"
		if committed {
			state, reason = store.MergeApplied, ""
		}
		if err := s.finish(ctx, &m, state, reason, nil); err != nil {
			return err
		}
		s.core.Event(ctx, target, "berth", "merge", "merge_"+state, reason, map[string]string{"merge": mid, "source": m.Source,
			"journal": j.State, "steps": strconv.Itoa(len(j.Steps))})
	}
	s.log.Info("merge recovered", "sandbox_id", target.ID, "merge", mid, "journal", j.State)
	return os.RemoveAll(dir)
}

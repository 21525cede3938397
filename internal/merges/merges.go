// Package merges is the merge service (issue 18, docs/FORK-MERGE.md §4):
// it owns stored merges of a fork ("source", theirs) into a target
// (usually its parent, ours) and their conflicts, plans them with the
// internal/merge engine against the fork point, and applies a clean plan
// atomically under a brief freeze of the target, with a journal in the
// daemon's data dir (merges/<id>/journal.json) that Recover rolls back
// after a crash. A target has at most one open merge; its conflicts are
// stored objects with stable ids, resolved by side or content. While a
// merge is open it pins the capture of the source (a snapshot) and the
// fork point; deleting the target aborts it.
//
// The service has no lock of its own: every operation on a target's merge
// runs under that target's sandbox lock (Core.Lock). The source is
// captured before the target is locked, so one operation never holds two
// sandbox locks (the daemon's lock order).
package merges

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lineage"
	"github.com/berth-dev/berth/internal/merge"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the service needs of the lifecycle core; daemon.mergeCore
// satisfies it.
type Core interface {
	Lock(id string) func()
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Store() store.Store
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error)
	SandboxDir(id string) string
	UserNS(sb *sandbox.Sandbox) *rootfs.IDMap
	// AgentClient reaches sb's agent (runsc targets are written through it).
	AgentClient(id string) *agentapi.Client
	// View is sb's live tree, LayersView a layer stack's (lineage).
	View(ctx context.Context, sb *sandbox.Sandbox) (lineage.View, error)
	LayersView(layers []string) (lineage.View, error)
	// Capture snapshots a running sandbox (frozen for the copy; counted
	// in its owner's snapshot quota); DropSnapshot deletes one.
	Capture(ctx context.Context, owner, actor, id string) (store.Snapshot, error)
	DropSnapshot(ctx context.Context, id string) error
	Now() time.Time
}

// Config configures the service.
type Config struct {
	DataDir string
	Log     *slog.Logger
	// PauseAfterStep, when > 0, holds every commit after its first step
	// for that long (the e2e test of a daemon killed mid-merge sets it
	// with BERTH_TEST_MERGE_PAUSE).
	PauseAfterStep time.Duration
}

// Service is the merge service.
type Service struct {
	core Core
	cfg  Config
	log  *slog.Logger
}

// New builds the service.
func New(core Core, cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Service{core: core, cfg: cfg, log: cfg.Log}
}

// OpenFile is a process of the target that has a path the merge changed open.
type OpenFile struct {
	PID  int    `json:"pid"`
	Cmd  string `json:"cmd"`
	Path string `json:"path"`
}

// Result is what an applied merge did.
type Result struct {
	Writes    int        `json:"writes"`
	Deletes   int        `json:"deletes"`
	OpenFiles []OpenFile `json:"open_files,omitempty"`
	Ms        int64      `json:"ms"`
	// Phases are where Ms went (phases.go).
	Phases Phases `json:"phases_ms,omitempty"`
}

// Merge is a merge as the API shows it.
type Merge struct {
	ID        string
	Target    string
	Source    string
	Base      string // fork point snapshot
	Strategy  merge.Strategy
	State     string
	Conflicts int // unresolved
	Result
	Reason    string
	CreatedAt time.Time
}

// Request starts a merge of Source into Target.
type Request struct {
	Owner, Actor   string
	Target, Source string
	Strategy       string
	Paths          []string
}

// maxPaths bounds a request's path filters.
const maxPaths = 256

// Start captures the source, plans the merge into the target and, when
// the plan is clean, applies it. A plan with conflicts is stored
// (conflicted) for Resolve/Continue.
func (s *Service) Start(ctx context.Context, req Request) (Merge, error) {
	st, err := merge.ParseStrategy(req.Strategy)
	if err != nil {
		return Merge{}, err
	}
	if len(req.Paths) > maxPaths {
		return Merge{}, errs.Field("paths", "at most %d path filters, got %d", maxPaths, len(req.Paths))
	}
	for _, p := range req.Paths {
		if p == "" || len(p) > 4096 || strings.ContainsRune(p, 0) {
			return Merge{}, errs.Field("paths", "path filter %q is empty, too long or has a NUL", p)
		}
	}
	if req.Source == "" {
		return Merge{}, errs.Field("source", "must name the sandbox to merge from")
	}
	if req.Source == req.Target {
		return Merge{}, errs.Field("source", "a sandbox cannot be merged into itself")
	}
	target, err := s.core.Visible(ctx, req.Owner, req.Target)
	if err != nil {
		return Merge{}, err
	}
	source, err := s.core.Visible(ctx, req.Owner, req.Source)
	if err != nil {
		return Merge{}, err
	}
	base, err := s.forkPoint(ctx, target, source)
	if err != nil {
		return Merge{}, err
	}
	if err := writable(target); err != nil {
		return Merge{}, err
	}
	if open, err := s.openMerge(ctx, target.ID); err != nil {
		return Merge{}, err
	} else if open != nil {
		return Merge{}, errs.E(errs.Conflict, "sandbox %s has an open merge %s (from %s); `berth merge --continue %s` or `--abort` it first",
			target.ID, open.ID, open.Source, target.ID)
	}
	// Theirs becomes immutable: a snapshot of the source, taken under the
	// source's lock alone.
	t0 := time.Now()
	clk := newClock(t0)
	capt, err := s.core.Capture(ctx, req.Owner, req.Actor, source.ID)
	if err != nil {
		return Merge{}, err
	}
	clk.mark("capture")
	keep := false
	defer func() {
		if !keep {
			s.dropSnapshot(ctx, capt.ID)
		}
	}()
	unlock := s.core.Lock(target.ID)
	defer unlock()
	if target, err = s.core.Visible(ctx, req.Owner, target.ID); err != nil {
		return Merge{}, err
	}
	if err := writable(target); err != nil {
		return Merge{}, err
	}
	m := store.Merge{ID: sandbox.NewID(), Owner: target.Owner, Target: target.ID, Source: source.ID,
		BaseSnapshot: base.ID, SourceSnapshot: capt.ID, SourceLayer: capt.Layers[0], Strategy: string(st),
		CreatedAt: s.core.Now().UTC()}
	captured := time.Since(t0)
	start := time.Now()
	v, err := s.openViews(ctx, target, base.Layers, capt.Layers)
	if err != nil {
		return Merge{}, err
	}
	defer v.Close()
	plan, err := merge.Compute(ctx, merge.Inputs{Base: v.base, Ours: v.ours, Theirs: v.theirs}, merge.Options{Strategy: st, Paths: req.Paths})
	if err != nil {
		return Merge{}, err
	}
	plan = withoutPrivate(plan)
	clk.mark("plan")
	m.State = store.MergePlanned
	if !plan.Clean() {
		m.State = store.MergeConflicted
	}
	if err := s.create(ctx, &m, plan, planMeta{Paths: req.Paths, Base: base.Layers}); err != nil {
		return Merge{}, err
	}
	keep = true
	clk.mark("store")
	s.log.Info("merge planned", "sandbox_id", target.ID, "merge", m.ID, "source", source.ID, "state", m.State,
		"capture_ms", captured.Milliseconds(), "plan_ms", time.Since(start).Milliseconds())
	s.core.Event(ctx, target, req.Actor, "merge", "merge_planned", "", map[string]string{
		"capture_ms": formatInt(captured.Milliseconds()),
		"merge":      m.ID, "source": source.ID, "base": base.ID, "strategy": string(st), "state": m.State,
		"writes": itoa(len(plan.Writes)), "deletes": itoa(len(plan.Deletes)), "conflicts": itoa(len(plan.Conflicts))})
	if !plan.Clean() {
		return s.view(ctx, m)
	}
	return s.applyLocked(ctx, target, m, plan, req.Actor, t0, clk)
}

// writable says whether a target can take a merge now.
func writable(sb *sandbox.Sandbox) error {
	if sb.State != sandbox.Running {
		return errs.E(errs.FailedPrecondition, "sandbox %s is %s; a merge needs a running target", sb.ID, sb.State)
	}
	if sb.Runtime != "runc" && sb.Runtime != "runsc" {
		return errs.E(errs.NotImplemented, "merging into a %s sandbox is not implemented", sb.Runtime)
	}
	return nil
}

// forkPoint is the snapshot source started from, which must be a capture
// of target: the base of the three-way merge.
func (s *Service) forkPoint(ctx context.Context, target, source *sandbox.Sandbox) (store.Snapshot, error) {
	if source.Lineage.Snapshot == "" {
		return store.Snapshot{}, errs.E(errs.FailedPrecondition, "sandbox %s was not forked: no common base with %s", source.ID, target.ID)
	}
	sn, err := s.core.Store().GetSnapshot(ctx, source.Lineage.Snapshot)
	if errs.Is(err, errs.NotFound) {
		return store.Snapshot{}, errs.E(errs.FailedPrecondition, "the fork point %s of %s is gone", source.Lineage.Snapshot, source.ID)
	}
	if err != nil {
		return store.Snapshot{}, err
	}
	if sn.SourceSandbox != target.ID {
		return store.Snapshot{}, errs.E(errs.FailedPrecondition, "sandbox %s was forked from %s, not from %s: no common base",
			source.ID, sn.SourceSandbox, target.ID)
	}
	return sn, nil
}

// planMeta is what a stored plan keeps beside the engine's plan: the
// request's path filters (for re-planning) and the fork point's layers
// (so the merge does not depend on the fork snapshot's record; the layers
// stay pinned by the capture of the source, which runs on them).
type planMeta struct {
	Paths []string `json:"paths,omitempty"`
	Base  []string `json:"base,omitempty"`
}

// planDoc is the stored plan: the engine's plan without its conflicts
// (they are rows) and its planMeta.
type planDoc struct {
	Plan *merge.Plan `json:"plan"`
	planMeta
}

func (s *Service) create(ctx context.Context, m *store.Merge, plan *merge.Plan, meta planMeta) error {
	var cs []store.MergeConflict
	for _, c := range plan.Conflicts {
		data, err := json.Marshal(c)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "encode conflict")
		}
		cs = append(cs, store.MergeConflict{ID: c.ID, Path: c.Path, Kind: string(c.Kind), Message: c.Message, Data: data})
	}
	b, err := encodePlan(plan, meta)
	if err != nil {
		return err
	}
	m.Plan, m.Result = b, []byte("{}")
	err = s.core.Store().CreateMerge(ctx, *m, cs)
	if errs.Is(err, errs.AlreadyExists) {
		return errs.Reclassify(errs.Conflict, err, "sandbox %s has an open merge", m.Target)
	}
	return err
}

func encodePlan(plan *merge.Plan, meta planMeta) ([]byte, error) {
	p := *plan
	p.Conflicts = nil
	b, err := json.Marshal(planDoc{Plan: &p, planMeta: meta})
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "encode plan")
	}
	return b, nil
}

// loadPlan is a stored merge's plan with its unresolved conflicts.
func (s *Service) loadPlan(ctx context.Context, m store.Merge) (*merge.Plan, planMeta, error) {
	var doc planDoc
	if err := json.Unmarshal(m.Plan, &doc); err != nil || doc.Plan == nil {
		return nil, planMeta{}, errs.E(errs.Internal, "merge %s: stored plan unreadable", m.ID)
	}
	rows, err := s.core.Store().ListMergeConflicts(ctx, m.ID)
	if err != nil {
		return nil, planMeta{}, err
	}
	for _, r := range rows {
		if len(r.Resolution) > 0 {
			continue
		}
		var c merge.Conflict
		if err := json.Unmarshal(r.Data, &c); err != nil {
			return nil, planMeta{}, errs.E(errs.Internal, "merge %s: stored conflict %s unreadable", m.ID, r.ID)
		}
		doc.Plan.Conflicts = append(doc.Plan.Conflicts, c)
	}
	return doc.Plan, doc.planMeta, nil
}

// openMerge is target's open merge, nil if none.
func (s *Service) openMerge(ctx context.Context, target string) (*store.Merge, error) {
	all, err := s.core.Store().ListMerges(ctx, target)
	if err != nil {
		return nil, err
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Open() {
			return &all[i], nil
		}
	}
	return nil, nil
}

// mustOpen is the open merge of a visible target (mid "" = whichever).
func (s *Service) mustOpen(ctx context.Context, owner, target, mid string) (*sandbox.Sandbox, store.Merge, error) {
	sb, err := s.core.Visible(ctx, owner, target)
	if err != nil {
		return nil, store.Merge{}, err
	}
	m, err := s.openMerge(ctx, sb.ID)
	if err != nil {
		return nil, store.Merge{}, err
	}
	if m == nil {
		return nil, store.Merge{}, errs.E(errs.NotFound, "sandbox %s has no open merge", sb.ID)
	}
	if mid != "" && m.ID != mid {
		if old, err := s.core.Store().GetMerge(ctx, mid); err == nil && old.Target == sb.ID {
			return nil, store.Merge{}, errs.E(errs.FailedPrecondition, "merge %s is %s", mid, old.State)
		}
		return nil, store.Merge{}, errs.E(errs.NotFound, "merge %s of sandbox %s not found", mid, sb.ID)
	}
	return sb, *m, nil
}

// Get returns one merge into target.
func (s *Service) Get(ctx context.Context, owner, target, mid string) (Merge, error) {
	sb, err := s.core.Visible(ctx, owner, target)
	if err != nil {
		return Merge{}, err
	}
	m, err := s.core.Store().GetMerge(ctx, mid)
	if err != nil || m.Target != sb.ID {
		return Merge{}, errs.E(errs.NotFound, "merge %s of sandbox %s not found", mid, sb.ID)
	}
	return s.view(ctx, m)
}

// List returns the merges into target, oldest first.
func (s *Service) List(ctx context.Context, owner, target string) ([]Merge, error) {
	sb, err := s.core.Visible(ctx, owner, target)
	if err != nil {
		return nil, err
	}
	all, err := s.core.Store().ListMerges(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	out := make([]Merge, 0, len(all))
	for _, m := range all {
		v, err := s.view(ctx, m)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Conflicts lists the unresolved conflicts of target's open merge.
func (s *Service) Conflicts(ctx context.Context, owner, target string) (Merge, []merge.Conflict, error) {
	_, m, err := s.mustOpen(ctx, owner, target, "")
	if err != nil {
		return Merge{}, nil, err
	}
	plan, _, err := s.loadPlan(ctx, m)
	if err != nil {
		return Merge{}, nil, err
	}
	v, err := s.view(ctx, m)
	return v, plan.Conflicts, err
}

// Resolve settles one conflict of target's open merge; resolving the last
// one applies the merge.
func (s *Service) Resolve(ctx context.Context, owner, actor, target, cid string, r merge.Resolution) (Merge, error) {
	unlock := s.core.Lock(target)
	defer unlock()
	sb, m, err := s.mustOpen(ctx, owner, target, "")
	if err != nil {
		return Merge{}, err
	}
	plan, meta, err := s.loadPlan(ctx, m)
	if err != nil {
		return Merge{}, err
	}
	if err := plan.Resolve(cid, r); err != nil {
		return Merge{}, err
	}
	res, err := json.Marshal(r)
	if err != nil {
		return Merge{}, errs.Wrap(errs.Internal, err, "encode resolution")
	}
	b, err := encodePlan(plan, meta)
	if err != nil {
		return Merge{}, err
	}
	if err := s.core.Store().ResolveMergeConflict(ctx, m.ID, cid, res, b); err != nil {
		return Merge{}, err
	}
	m.Plan = b
	side := string(r.Side)
	if side == "" {
		side = "content"
	}
	s.core.Event(ctx, sb, actor, "merge", "conflict_resolved", "", map[string]string{"merge": m.ID, "conflict": cid, "by": side})
	if !plan.Clean() {
		return s.view(ctx, m)
	}
	return s.applyStored(ctx, sb, m, plan, actor)
}

// Continue applies target's open merge once its conflicts are resolved.
func (s *Service) Continue(ctx context.Context, owner, actor, target, mid string) (Merge, error) {
	unlock := s.core.Lock(target)
	defer unlock()
	sb, m, err := s.mustOpen(ctx, owner, target, mid)
	if err != nil {
		return Merge{}, err
	}
	plan, _, err := s.loadPlan(ctx, m)
	if err != nil {
		return Merge{}, err
	}
	if !plan.Clean() {
		return Merge{}, errs.E(errs.FailedPrecondition, "merge %s has %d unresolved conflict(s); see `berth conflicts %s`", m.ID, len(plan.Conflicts), sb.ID)
	}
	return s.applyStored(ctx, sb, m, plan, actor)
}

// Abort drops target's open merge; the target is not changed.
func (s *Service) Abort(ctx context.Context, owner, actor, target, mid string) (Merge, error) {
	unlock := s.core.Lock(target)
	defer unlock()
	sb, m, err := s.mustOpen(ctx, owner, target, mid)
	if err != nil {
		return Merge{}, err
	}
	if err := s.finish(ctx, &m, store.MergeAborted, "aborted", nil); err != nil {
		return Merge{}, err
	}
	s.core.Event(ctx, sb, actor, "merge", "merge_aborted", "", map[string]string{"merge": m.ID, "source": m.Source})
	return s.view(ctx, m)
}

// TargetDeleted aborts target's open merge (the sandbox is going away; the
// rows go with it, the source's capture is dropped here). Called by the
// core under the target's lock.
func (s *Service) TargetDeleted(ctx context.Context, target string) {
	m, err := s.openMerge(ctx, target)
	if err != nil || m == nil {
		return
	}
	if err := s.finish(ctx, m, store.MergeAborted, "target_deleted", nil); err != nil {
		s.log.Warn("abort merge of a deleted sandbox", "sandbox_id", target, "merge", m.ID, "err", err)
	}
	_ = os.RemoveAll(s.journalDir(m.ID))
}

// finish moves m to a final state and drops its capture of the source.
func (s *Service) finish(ctx context.Context, m *store.Merge, state, reason string, res *Result) error {
	m.State, m.Reason = state, reason
	if res != nil {
		b, err := json.Marshal(res)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "encode merge result")
		}
		m.Result = b
	}
	m.UpdatedAt = s.core.Now().UTC()
	if err := s.core.Store().UpdateMerge(ctx, *m); err != nil {
		return err
	}
	s.dropSnapshot(ctx, m.SourceSnapshot)
	return nil
}

func (s *Service) dropSnapshot(ctx context.Context, id string) {
	if id == "" {
		return
	}
	if err := s.core.DropSnapshot(context.WithoutCancel(ctx), id); err != nil && !errs.Is(err, errs.NotFound) {
		s.log.Warn("drop merge capture", "snapshot", id, "err", err)
	}
}

// view is the API form of a stored merge.
func (s *Service) view(ctx context.Context, m store.Merge) (Merge, error) {
	v := Merge{ID: m.ID, Target: m.Target, Source: m.Source, Base: m.BaseSnapshot, Strategy: merge.Strategy(m.Strategy),
		State: m.State, Reason: m.Reason, CreatedAt: m.CreatedAt}
	if len(m.Result) > 0 {
		_ = json.Unmarshal(m.Result, &v.Result)
	}
	if m.Open() {
		rows, err := s.core.Store().ListMergeConflicts(ctx, m.ID)
		if err != nil {
			return Merge{}, err
		}
		for _, r := range rows {
			if len(r.Resolution) == 0 {
				v.Conflicts++
			}
		}
		if plan, _, err := s.loadPlan(ctx, m); err == nil && v.State == store.MergeConflicted {
			v.Writes, v.Deletes = len(plan.Writes), len(plan.Deletes)
		}
	}
	return v, nil
}

func (s *Service) journalDir(mid string) string { return filepath.Join(s.cfg.DataDir, "merges", mid) }

func itoa(n int) string { return formatInt(int64(n)) }

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

package leases

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Reissue is a resume's lease change folded into the resume's own commit
// (internal/checkpoint ResumeAs): planned from store reads while the
// sandbox thaws, written by store.TransitionLeases with the move to
// running, then published (files beside the commit, audits and the proxy's
// grants after it). The resumed hook then has nothing left to do
// (statehook.Event.LeasesReissued). A commit that fails leaves the
// sandbox's state and leases as they were; the caller then commits the
// state alone and lets the hook reissue (its error said as before).
type Reissue struct {
	s      *Service
	sb     *sandbox.Sandbox // as planned from (paused)
	ch     Change
	seen   int
	after  []store.Lease
	cur    map[string]string
	actor  string
	phases *phases.Timer
	// setProxy registers the grants opened at the plan (nil: open them
	// after the commit).
	setProxy func() error
}

// PlanReissue plans the reissue of a resume of sb (store reads only: it
// may run beside the thaw, under the sandbox's lock). nil: nothing to
// change (no lease and no granted secret).
func (s *Service) PlanReissue(ctx context.Context, sb *sandbox.Sandbox, actor string) (*Reissue, error) {
	ph := phases.Start("lease fold")
	ls, ch, err := s.read(ctx, sb, OpReissue, ReasonResumed, ph)
	if err != nil || ch.Empty() {
		return nil, err
	}
	all := After(ls, ch)
	r := &Reissue{s: s, sb: sb, ch: ch, seen: len(ls), after: all, cur: Current(all, s.core.Now()), actor: actor, phases: ph}
	// The proxy's grants as they will be once running, their secrets
	// opened now; a failure here is tried again after the commit.
	running := *sb
	running.State = sandbox.Running
	if set, err := s.core.PrepareProxyLeases(ctx, &running, s.proxyList(all, &running)); err == nil {
		r.setProxy = set
	}
	ph.Mark("proxy_open")
	return r, nil
}

// Rows is the change for store.TransitionLeases.
func (r *Reissue) Rows() store.LeaseChange {
	return store.LeaseChange{Set: r.ch.Set, Issue: r.ch.Issue, Seen: r.seen}
}

// SetRow makes the sandbox's row hold the new placeholders (inside the
// commit's transition fn).
func (r *Reissue) SetRow(sb *sandbox.Sandbox) { SetPlaceholders(sb, r.cur, "") }

// WriteFiles writes the sandbox's env.json and leases.env with the new
// placeholders, beside the commit: if the commit fails they name
// placeholders of no lease, which the proxy refuses (fail closed).
func (r *Reissue) WriteFiles() error {
	t := time.Now()
	p, envChanged := predict(r.sb, r.cur)
	err := r.s.core.WriteFiles(p, EnvFile(r.cur), envChanged)
	r.phases.Add("files", time.Since(t))
	return err
}

// Committed publishes the committed change: audits, and the proxy's grants
// from the leases just written (out is the sandbox as committed).
func (r *Reissue) Committed(ctx context.Context, out *sandbox.Sandbox) (err error) {
	defer func() { r.phases.Log(ctx, r.s.cfg.Log, out.ID, err) }()
	r.phases.Mark("until_committed") // beside the thaw, then the commit
	r.s.auditChange(ctx, r.actor, out.ID, r.ch)
	if r.setProxy != nil && out.State == sandbox.Running {
		err = r.setProxy()
	} else {
		err = r.s.setProxyLeases(ctx, out, r.s.proxyList(r.after, out))
	}
	r.phases.Mark("refresh")
	return err
}

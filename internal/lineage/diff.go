package lineage

import (
	"context"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Bounds of a diff answer.
const (
	// MaxTextBytesLimit is the largest per-file text size a caller may ask for.
	MaxTextBytesLimit = 16 << 20
	// MaxUnifiedTotal bounds the unified text of one answer; past it the
	// remaining changes keep their counts and say text_omitted.
	MaxUnifiedTotal = 32 << 20
	// OmittedTooLarge is the TextOmitted reason a bounded answer gives.
	OmittedTooLarge = "answer size limit"
)

// CheckpointPrefix marks a checkpoint in DiffRequest.Against.
const CheckpointPrefix = "checkpoint:"

// DiffRequest asks for the changes of sandbox ID.
type DiffRequest struct {
	Owner string // "" = admin
	ID    string
	// Against is "" (the changes since ID's fork point, or its template),
	// another sandbox's id (the changes that turn ID's tree into that
	// one's, like `git diff A B`), or "checkpoint:C" (the changes since
	// ID's checkpoint C).
	Against string
	Options fsdiff.Options
}

// Against parsed.
type against struct {
	kind       string // "base", "sandbox", "checkpoint"
	id         string
	checkpoint string
}

// parseAgainst reads DiffRequest.Against.
func parseAgainst(s string) (against, error) {
	switch {
	case s == "":
		return against{kind: "base"}, nil
	case strings.HasPrefix(s, CheckpointPrefix):
		c := strings.TrimPrefix(s, CheckpointPrefix)
		if c == "" || !sandbox.ValidID(c) {
			return against{}, errs.Field("against", "checkpoint id %q is not an id of lowercase letters and digits", c)
		}
		return against{kind: "checkpoint", checkpoint: c}, nil
	case sandbox.ValidID(s):
		return against{kind: "sandbox", id: s}, nil
	default:
		return against{}, errs.Field("against", "want a sandbox id or checkpoint:ID, got %q", s)
	}
}

// commonBase is how many bottom layers the stacks a and b (top first)
// share; 0 means they are unrelated.
func commonBase(a, b []string) int {
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n] == b[len(b)-1-n] {
		n++
	}
	return n
}

// checkOptions bounds what a caller may ask of a diff.
func checkOptions(o *fsdiff.Options) error {
	if o.MaxTextBytes < 0 || o.MaxTextBytes > MaxTextBytesLimit {
		return errs.Field("max_text", "must be 0 (1 MiB) to %d bytes, got %d", MaxTextBytesLimit, o.MaxTextBytes)
	}
	if len(o.Paths) > 1000 {
		return errs.E(errs.ResourceExhausted, "at most 1000 paths, got %d", len(o.Paths))
	}
	for _, p := range o.Paths {
		if p == "" || len(p) > 4096 {
			return errs.Field("path", "a path is 1-4096 bytes")
		}
	}
	return nil
}

// Bound drops unified text past max bytes in all (in path order, so the
// answer is stable), keeping counts and saying so in TextOmitted.
func Bound(res *fsdiff.Result, max int) {
	total := 0
	for i := range res.Changes {
		c := &res.Changes[i]
		if c.Unified == "" {
			continue
		}
		if total+len(c.Unified) > max {
			c.Unified = ""
			c.TextOmitted = OmittedTooLarge
			continue
		}
		total += len(c.Unified)
	}
}

// Diff answers req: the view it is counted from, the view it is counted
// to, and the file-level changes between them.
func (s *Service) Diff(ctx context.Context, req DiffRequest) (*fsdiff.Result, error) {
	ag, err := parseAgainst(req.Against)
	if err != nil {
		return nil, err
	}
	if err := checkOptions(&req.Options); err != nil {
		return nil, err
	}
	sb, err := s.core.Visible(ctx, req.Owner, req.ID)
	if err != nil {
		return nil, err
	}
	// The sides: a view builder each, resolved once. A sandbox that is
	// not running is read under its lock (stoppedView): two of them are
	// locked in id order, so diffs of A B and B A cannot deadlock.
	var fromView, toView func() (View, error)
	swap := false
	switch ag.kind {
	case "base":
		fromView = func() (View, error) { return s.ForkPoint(ctx, sb) }
		toView = func() (View, error) { return s.anyView(ctx, req.Owner, sb) }
	case "sandbox":
		other, err := s.core.Visible(ctx, req.Owner, ag.id)
		if err != nil {
			return nil, err
		}
		fromView = func() (View, error) { return s.anyView(ctx, req.Owner, sb) }
		toView = func() (View, error) { return s.anyView(ctx, req.Owner, other) }
		swap = other.ID < sb.ID
	case "checkpoint":
		r := s.checkpointResolver()
		if r == nil {
			return nil, errs.E(errs.NotFound, "checkpoint %q of sandbox %s not found", ag.checkpoint, sb.ID)
		}
		layers, err := r.CheckpointLayers(ctx, sb.ID, ag.checkpoint)
		if err != nil {
			return nil, err
		}
		fromView = func() (View, error) { return s.LayersView(layers) }
		toView = func() (View, error) { return s.anyView(ctx, req.Owner, sb) }
	}
	// A live upper changes while it is read: a file listed a moment ago
	// may be gone when it is opened (NotFound). The diff is "as of about
	// now", so it is taken again on fresh views, a few times.
	var lastErr error
	for attempt := 0; attempt < diffAttempts; attempt++ {
		res, changed, err := s.diffOnce(ctx, req, fromView, toView, swap)
		if err == nil || !changed || ctx.Err() != nil {
			return res, err
		}
		lastErr = err
	}
	// Not a NotFound for the caller (no such sandbox?): try again later.
	return nil, errs.Reclassify(errs.Unavailable, lastErr, "sandbox %s kept changing while it was diffed (%d tries)", req.ID, diffAttempts)
}

// diffAttempts is how often a diff of a changing tree is taken.
const diffAttempts = 5

// diffOnce diffs fresh views; changed says the error is a path that
// vanished while the diff read it (worth another try).
func (s *Service) diffOnce(ctx context.Context, req DiffRequest, fromView, toView func() (View, error), toFirst bool) (*fsdiff.Result, bool, error) {
	first, second := fromView, toView
	if toFirst {
		first, second = toView, fromView
	}
	a, err := first()
	if err != nil {
		return nil, false, err
	}
	defer a.Close()
	b, err := second()
	if err != nil {
		return nil, false, err
	}
	defer b.Close()
	from, to := a, b
	if toFirst {
		from, to = b, a
	}
	if commonBase(from.Digests, to.Digests) == 0 {
		return nil, false, errs.E(errs.FailedPrecondition, "no common base: %s and %s share no layer", req.ID, describeAgainst(req))
	}
	res, err := fsdiff.Diff(ctx, from.Tree, to.Tree, req.Options)
	if err != nil {
		return nil, errs.Is(err, errs.NotFound), err
	}
	Bound(res, MaxUnifiedTotal)
	return res, false, nil
}

func describeAgainst(req DiffRequest) string {
	if req.Against == "" {
		return "its base"
	}
	return req.Against
}

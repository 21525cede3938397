package lineage

import (
	"context"
	"errors"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Compare bounds.
const (
	// CompareConcurrency is how many children are examined at once.
	CompareConcurrency = 4
	// MaxChildren is the most children one compare examines.
	MaxChildren = 100
	// OutputTailBytes is how much of a check's output a report keeps.
	OutputTailBytes = 4 << 10
	// DefaultCheckTimeout bounds a check run without a timeout.
	DefaultCheckTimeout = 10 * time.Minute
	// MaxCheckTimeout is the longest check a caller may ask for.
	MaxCheckTimeout = 2 * time.Hour
	// MaxCheckBytes bounds the check command's text.
	MaxCheckBytes = 64 << 10
)

// Executor runs a check in a sandbox through the normal exec path and
// meters it (part of Core).
type Executor interface {
	// Agent is a running sandbox's agent client (Unavailable if it is not running).
	Agent(ctx context.Context, owner, id string) (*agentapi.Client, error)
	// Usage is a sandbox's metered usage (zero if none was recorded).
	Usage(ctx context.Context, id string) (Cost, error)
}

// Cost is a child's metered usage over its life.
type Cost struct {
	CPUSeconds       float64
	MemoryGiBSeconds float64
	RunningSeconds   float64
	CostActive       float64
	CostReserved     float64
}

// CheckResult is one check run.
type CheckResult struct {
	ExitCode   int
	Signal     string
	TimedOut   bool
	Ms         int64
	OutputTail string
	Error      string // the check could not run or its stream broke
}

// Passed is a check that ran and exited 0.
func (c *CheckResult) Passed() bool {
	return c != nil && c.Error == "" && !c.TimedOut && c.Signal == "" && c.ExitCode == 0
}

// ChildReport is one child of a compare.
type ChildReport struct {
	ID    string
	State sandbox.State
	Stat  *fsdiff.Stat // nil: the diff failed (Error says why)
	Check *CheckResult // nil: no check asked, or the child is not running
	Cost  *Cost
	Error string
}

// CompareRequest asks for the children of ID to be compared.
type CompareRequest struct {
	Owner   string // "" = admin
	ID      string
	Check   string // shell command; "" = none
	Timeout time.Duration
}

// diffSize orders children with smaller changes first.
func diffSize(s *fsdiff.Stat) int {
	if s == nil {
		return int(^uint(0) >> 1)
	}
	return s.LinesAdded + s.LinesRemoved + s.Files
}

// SortChildren orders a compare: passing checks first, then the smaller
// diff, then id (so the order is stable).
func SortChildren(cs []ChildReport) {
	sort.SliceStable(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if pa, pb := a.Check.Passed(), b.Check.Passed(); pa != pb {
			return pa
		}
		if sa, sb := diffSize(a.Stat), diffSize(b.Stat); sa != sb {
			return sa < sb
		}
		return a.ID < b.ID
	})
}

// tail keeps the last n bytes written to it.
type tail struct {
	n   int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.n {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.n:]...)
	}
	return len(p), nil
}

func checkCompare(req *CompareRequest) error {
	if len(req.Check) > MaxCheckBytes {
		return errs.Field("check", "at most %d bytes", MaxCheckBytes)
	}
	if req.Timeout < 0 || req.Timeout > MaxCheckTimeout {
		return errs.Field("timeout", "must be between 0 (%s) and %s", DefaultCheckTimeout, MaxCheckTimeout)
	}
	if req.Timeout == 0 {
		req.Timeout = DefaultCheckTimeout
	}
	return nil
}

// Compare reports every child of req.ID (sandboxes whose Lineage.Parent it
// is, visible to the caller): its diff stat against its fork point, the
// check run in it, its metered cost. Children are examined in parallel,
// at most CompareConcurrency at a time.
func (s *Service) Compare(ctx context.Context, req CompareRequest) ([]ChildReport, error) {
	if err := checkCompare(&req); err != nil {
		return nil, err
	}
	parent, err := s.core.Visible(ctx, req.Owner, req.ID)
	if err != nil {
		return nil, err
	}
	children, err := s.children(ctx, parent)
	if err != nil {
		return nil, err
	}
	out := make([]ChildReport, len(children))
	sem := make(chan struct{}, CompareConcurrency)
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out[i] = ChildReport{ID: c.ID, State: c.State, Error: ctx.Err().Error()}
				return
			}
			defer func() { <-sem }()
			out[i] = s.compareOne(ctx, req, c)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	SortChildren(out)
	return out, nil
}

// children lists the sandboxes forked from parent, of parent's owner.
func (s *Service) children(ctx context.Context, parent *sandbox.Sandbox) ([]*sandbox.Sandbox, error) {
	var states []sandbox.State
	for _, st := range sandbox.States() {
		if st != sandbox.Deleted {
			states = append(states, st)
		}
	}
	var out []*sandbox.Sandbox
	after := ""
	for pages := 0; pages < 100; pages++ {
		list, next, err := s.core.Store().ListSandboxes(ctx, store.SandboxFilter{Owner: parent.Owner, States: states, Limit: 500, After: after})
		if err != nil {
			return nil, err
		}
		for _, sb := range list {
			if sb.Lineage.Parent == parent.ID && sb.ID != parent.ID {
				if len(out) == MaxChildren {
					return nil, errs.E(errs.ResourceExhausted, "sandbox %s has more than %d children", parent.ID, MaxChildren)
				}
				out = append(out, sb)
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	return out, nil
}

func (s *Service) compareOne(ctx context.Context, req CompareRequest, c *sandbox.Sandbox) ChildReport {
	r := ChildReport{ID: c.ID, State: c.State}
	var problems []error
	if st, err := s.stat(ctx, req.Owner, c); err != nil {
		problems = append(problems, err)
	} else {
		r.Stat = st
	}
	if req.Check != "" {
		if c.State != sandbox.Running {
			problems = append(problems, errs.E(errs.FailedPrecondition, "not running (%s): check not run", c.State))
		} else {
			r.Check = runCheck(ctx, s.core, req, c.ID)
		}
	}
	if cost, err := s.core.Usage(ctx, c.ID); err != nil {
		problems = append(problems, err)
	} else {
		r.Cost = &cost
	}
	if err := errors.Join(problems...); err != nil {
		r.Error = errs.Short(err)
	}
	return r
}

func (s *Service) stat(ctx context.Context, owner string, c *sandbox.Sandbox) (*fsdiff.Stat, error) {
	base, err := s.ForkPoint(ctx, c)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	v, err := s.anyView(ctx, owner, c)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	res, err := fsdiff.Diff(ctx, base.Tree, v.Tree, fsdiff.Options{NoText: true})
	if err != nil {
		return nil, err
	}
	return &res.Stat, nil
}

// runCheck runs the check through the agent's exec (as a user's exec:
// the sandbox's default user, bounded by the timeout) and keeps the tail
// of its output.
func runCheck(ctx context.Context, ex Executor, req CompareRequest, id string) *CheckResult {
	start := time.Now()
	res := &CheckResult{}
	finish := func(err error) *CheckResult {
		res.Ms = time.Since(start).Milliseconds()
		if err != nil {
			res.Error = errs.Short(err)
		}
		return res
	}
	c, err := ex.Agent(ctx, req.Owner, id)
	if err != nil {
		return finish(err)
	}
	// The agent kills the process at the timeout; the stream gets a
	// grace period past it to report the exit.
	sctx, cancel := context.WithTimeout(ctx, req.Timeout+30*time.Second)
	defer cancel()
	st, err := c.Exec(sctx, agentapi.ExecRequest{Shell: req.Check, Tag: "compare", TimeoutMs: req.Timeout.Milliseconds()}, 0)
	if err != nil {
		return finish(err)
	}
	defer st.Close()
	out := &tail{n: OutputTailBytes}
	for {
		ev, err := st.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errs.E(errs.Unavailable, "the exec stream ended before the check exited")
			}
			res.OutputTail = string(out.buf)
			return finish(err)
		}
		switch ev.Type {
		case "stdout", "stderr", "pty":
			_, _ = out.Write(ev.Data)
		case "exit":
			// The agent's exit event carries Error "timeout" when it
			// killed the process at the timeout; otherwise Error only
			// repeats the status ("exit status 3", "signal: killed").
			res.ExitCode, res.Signal, res.TimedOut = ev.ExitCode, ev.Signal, ev.Error == "timeout"

			res.OutputTail = string(out.buf)
			return finish(nil)
		case "error":
			res.OutputTail = string(out.buf)
			return finish(errs.E(errs.Unavailable, "exec: %s", ev.Error))
		}
	}
}

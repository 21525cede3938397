package lineage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/template"
)

// View is a tree of layers as fsdiff sees it, with what holds it open.
// Close it when done; a View is used by one goroutine at a time (its
// Tree caches lookups). Its file reads stop when the ctx it was built
// with ends, and draw on a budget (MaxReadBytes; no file with more than
// MaxHoleBytes of holes is read), so a long-lived user builds it on a
// context that lives as long as it does.
type View struct {
	Tree *fsdiff.Tree
	// Digests are the read-only layers below the upper, top first.
	Digests []string
	// Upper is the live upper's layer id ("upper:<id>" or, for a runsc
	// export, "upper:<id>@<n>"); "" for a layer stack.
	Upper string
	// UpperTar is the exported upper tar of a runsc sandbox that keeps its
	// writes in the sentry ("" otherwise); it is removed on Close. A
	// merge that needs theirs' full content extracts it
	// (rootfs.ExtractUpperTar).
	UpperTar string

	closer *closer
}

type closer struct {
	once sync.Once
	fns  []func() error
	err  error
}

// Close releases the view's layers and removes its scratch files.
func (v View) Close() error {
	if v.closer == nil {
		return nil
	}
	v.closer.once.Do(func() {
		var all []error
		for i := len(v.closer.fns) - 1; i >= 0; i-- {
			all = append(all, v.closer.fns[i]())
		}
		v.closer.err = errors.Join(all...)
	})
	return v.closer.err
}

// upperExporter is a runtime that keeps a container's rootfs writes to
// itself (runsc's in-sandbox overlay) and exports them as an upper tar.
type upperExporter interface {
	ExportUpper(ctx context.Context, id, file string) error
}

// Layers are the read-only layer digests sb runs on, top first: its
// pinned layers (a fork's are [S, T...]), else its template's.
func (s *Service) Layers(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	if len(sb.Layers) > 0 {
		return slices.Clone(sb.Layers), nil
	}
	tpl, err := s.core.Store().GetTemplate(ctx, sb.Template)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "template %s of sandbox %s", sb.Template, sb.ID)
	}
	if tpl.Fingerprint != sb.TemplateID {
		return nil, errs.E(errs.FailedPrecondition, "template %s changed since sandbox %s started", sb.Template, sb.ID)
	}
	return slices.Clone(tpl.Layers), nil
}

// LayersView is the view of a layer stack given as digests, top first (a
// snapshot's [S, T...], a checkpoint's [Δk..Δ1, S?, T...]).
func (s *Service) LayersView(layers []string) (View, error) {
	if len(layers) == 0 {
		return View{}, errs.E(errs.FailedPrecondition, "an empty layer stack has no view")
	}
	v := View{Digests: slices.Clone(layers), closer: &closer{}}
	ls, err := s.openLayers(context.Background(), v.closer, newBudget(MaxReadBytes), layers)
	if err != nil {
		_ = v.Close()
		return View{}, err
	}
	v.Tree = fsdiff.NewTree(ls...)
	return v, nil
}

func (s *Service) openLayers(ctx context.Context, c *closer, b *readBudget, digests []string) ([]fsdiff.Layer, error) {
	out := make([]fsdiff.Layer, 0, len(digests))
	for _, dg := range digests {
		if err := template.ValidateDigest(dg); err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %q", dg)
		}
		l, err := fsdiff.OpenDirLayer(s.core.LayerPath(dg), dg, nil)
		if err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %s is missing", dg)
		}
		c.fns = append(c.fns, l.Close)
		out = append(out, boundedLayer{Layer: l, b: b, ctx: ctx})
	}
	return out, nil
}

// ForkPoint is the view sb's changes are counted from: the fork
// snapshot's [S, T...] for a fork (its pinned layers), else its template's.
func (s *Service) ForkPoint(ctx context.Context, sb *sandbox.Sandbox) (View, error) {
	layers, err := s.Layers(ctx, sb)
	if err != nil {
		return View{}, err
	}
	return s.LayersView(layers)
}

// View is sb's tree as of about now: its upper over its lowers. runc (and
// runsc with --overlay2=none) write to the host upper dir, read beneath
// its root with owners unshifted to in-sandbox ids; a runsc sandbox that
// keeps its writes in the sentry is exported (`runsc tar rootfs-upper`)
// and indexed with bounds. A sandbox whose workspace is not mounted
// (stopped, paused to memory or disk) is FailedPrecondition.
func (s *Service) View(ctx context.Context, sb *sandbox.Sandbox) (View, error) {
	layers, err := s.Layers(ctx, sb)
	if err != nil {
		return View{}, err
	}
	v := View{Digests: layers, closer: &closer{}}
	ok := false
	defer func() {
		if !ok {
			_ = v.Close()
		}
	}()
	b := newBudget(MaxReadBytes)
	upper, err := s.upper(ctx, sb, &v, b)
	if err != nil {
		return View{}, err
	}
	lowers, err := s.openLayers(ctx, v.closer, b, layers)
	if err != nil {
		return View{}, err
	}
	v.Tree = fsdiff.NewTree(append([]fsdiff.Layer{upper}, lowers...)...)
	ok = true
	return v, nil
}

func (s *Service) upper(ctx context.Context, sb *sandbox.Sandbox, v *View, b *readBudget) (fsdiff.Layer, error) {
	if sb.State != sandbox.Running && sb.State != sandbox.Paused {
		return nil, errs.E(errs.FailedPrecondition, "sandbox %s is %s: start or resume it to diff it", sb.ID, sb.State)
	}
	upperDir, err := s.core.UpperDir(sb)
	if err != nil {
		return nil, err
	}
	if sb.Runtime == "runsc" && sb.State == sandbox.Running && !s.knownHostUpper(sb.ID) {
		l, ok, err := s.exportUpper(ctx, sb, v)
		if err != nil || ok {
			return l, err
		}
	}
	id := "upper:" + sb.ID
	var unshift func(uint32) uint32
	if m := s.core.UserNS(sb); m != nil {
		unshift = m.Unshift
	}
	l, err := fsdiff.OpenDirLayer(upperDir, id, unshift)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "workspace of sandbox %s", sb.ID)
	}
	v.Upper = id
	v.closer.fns = append(v.closer.fns, l.Close)
	return boundedLayer{Layer: l, b: b, ctx: ctx}, nil
}

func (s *Service) knownHostUpper(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostUpper[id]
}

// exportUpper asks runsc for the writes it keeps in its in-sandbox
// overlay. ok is false when the sandbox has none (--overlay2=none: the
// writes are in the host upper, remembered for the next view).
func (s *Service) exportUpper(ctx context.Context, sb *sandbox.Sandbox, v *View) (fsdiff.Layer, bool, error) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return nil, false, err
	}
	exp, isExp := rt.(upperExporter)
	if !isExp {
		return nil, false, nil
	}
	dir := filepath.Join(s.cfg.DataDir, "lineage")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, errs.Wrap(errs.Internal, err, "lineage scratch dir")
	}
	tmp, err := os.CreateTemp(dir, ".upper-"+sb.ID+"-*.tar")
	if err != nil {
		return nil, false, errs.Wrap(errs.Internal, err, "lineage scratch file")
	}
	name := tmp.Name()
	tmp.Close()
	v.closer.fns = append(v.closer.fns, func() error { return ignoreNotExist(os.Remove(name)) })
	if err := exp.ExportUpper(ctx, sb.ID, name); err != nil {
		if strings.Contains(err.Error(), "not an overlayfs") {
			s.mu.Lock()
			if len(s.hostUpper) >= maxRemembered {
				clear(s.hostUpper) // a cache: forgetting costs one runsc call per sandbox
			}
			s.hostUpper[sb.ID] = true
			s.mu.Unlock()
			return nil, false, nil
		}
		if errs.KindOf(err) == errs.NotImplemented {
			return nil, false, nil
		}
		return nil, false, err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, false, errs.Wrap(errs.Internal, err, "open upper tar")
	}
	defer f.Close()
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("upper:%s@%d", sb.ID, s.seq)
	s.mu.Unlock()
	l, err := fsdiff.NewTarLayer(id, f, fsdiff.TarOptions{})
	if err != nil {
		return nil, false, err
	}
	v.Upper, v.UpperTar = id, name
	return l, true, nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// maxRemembered bounds the host-upper cache.
const maxRemembered = 10000

// Forget drops what the service remembers of a deleted sandbox.
func (s *Service) Forget(id string) {
	s.mu.Lock()
	delete(s.hostUpper, id)
	s.mu.Unlock()
}

// stoppedView is the view of a sandbox whose workspace is not mounted
// (stopped, paused to memory or disk): under its lock, held until the
// view is closed so that nothing starts it meanwhile, its workspace image
// is mounted read-only. Only the service's own verbs (Diff, Compare) take
// it: they hold no sandbox lock, and a diff of two such sandboxes locks
// them in id order. Anything holding a sandbox's lock uses View.
func (s *Service) stoppedView(ctx context.Context, owner string, sb *sandbox.Sandbox) (View, error) {
	unlock := s.core.Lock(sb.ID)
	cur, err := s.core.Visible(ctx, owner, sb.ID)
	if err != nil {
		unlock()
		return View{}, err
	}
	if cur.State == sandbox.Running || cur.State == sandbox.Paused {
		if v, err := s.View(ctx, cur); err == nil || !errs.Is(err, errs.FailedPrecondition) || cur.State == sandbox.Running {
			unlock()
			return v, err
		}
	}
	if cur.State != sandbox.Stopped && cur.State != sandbox.Paused {
		unlock()
		return View{}, errs.E(errs.FailedPrecondition, "sandbox %s is %s: its workspace cannot be read", cur.ID, cur.State)
	}
	layers, err := s.Layers(ctx, cur)
	if err != nil {
		unlock()
		return View{}, err
	}
	v := View{Digests: layers, closer: &closer{fns: []func() error{func() error { unlock(); return nil }}}}
	ok := false
	defer func() {
		if !ok {
			_ = v.Close()
		}
	}()
	upperDir, release, err := s.core.MountWorkspace(ctx, cur)
	if err != nil {
		return View{}, err
	}
	v.closer.fns = append(v.closer.fns, release)
	var unshift func(uint32) uint32
	if m := s.core.UserNS(cur); m != nil {
		unshift = m.Unshift
	}
	b := newBudget(MaxReadBytes)
	v.Upper = "upper:" + cur.ID
	ul, err := fsdiff.OpenDirLayer(upperDir, v.Upper, unshift)
	if err != nil {
		return View{}, errs.Wrap(errs.FailedPrecondition, err, "workspace of sandbox %s", cur.ID)
	}
	v.closer.fns = append(v.closer.fns, ul.Close)
	lowers, err := s.openLayers(ctx, v.closer, b, layers)
	if err != nil {
		return View{}, err
	}
	v.Tree = fsdiff.NewTree(append([]fsdiff.Layer{boundedLayer{Layer: ul, b: b, ctx: ctx}}, lowers...)...)
	ok = true
	return v, nil
}

// anyView is View, or stoppedView for a sandbox whose workspace is not
// mounted.
func (s *Service) anyView(ctx context.Context, owner string, sb *sandbox.Sandbox) (View, error) {
	if sb.State == sandbox.Running {
		return s.View(ctx, sb)
	}
	if sb.State == sandbox.Paused {
		if v, err := s.View(ctx, sb); err == nil || !errs.Is(err, errs.FailedPrecondition) {
			return v, err
		}
	}
	return s.stoppedView(ctx, owner, sb)
}

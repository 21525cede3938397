package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

func (s *Snapshots) dir(id string) string { return filepath.Join(s.cfg.DataDir, "snapshots", id) }

// upperExporter is a runtime that keeps a container's rootfs writes to
// itself (runsc's in-sandbox overlay) and can export them as an overlay
// upper tar. runc writes to the host upper dir, which the daemon copies.
type upperExporter interface {
	ExportUpper(ctx context.Context, id, file string) error
}

// layerDigests are the lower layers sb runs on, top first.
func (s *Snapshots) layerDigests(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	if len(sb.Layers) > 0 {
		return slices.Clone(sb.Layers), nil
	}
	tpl, err := s.core.Store().GetTemplate(ctx, sb.Template)
	if err != nil {
		return nil, errs.Wrap(errs.FailedPrecondition, err, "template %s of sandbox %s", sb.Template, sb.ID)
	}
	if tpl.Fingerprint != sb.TemplateID {
		return nil, errs.E(errs.FailedPrecondition, "template %s changed since sandbox %s started (fingerprint %s, now %s)",
			sb.Template, sb.ID, sb.TemplateID, tpl.Fingerprint)
	}
	return tpl.Layers, nil
}

// LowersFor resolves the layers a sandbox boots on to host paths: the
// snapshot's layers for a sandbox started from a snapshot, else the template's.
func (s *Snapshots) LowersFor(sb *sandbox.Sandbox, tpl *store.Template) ([]string, error) {
	if len(sb.Layers) == 0 {
		return s.core.TemplateLowers(tpl)
	}
	var out []string
	for _, dg := range sb.Layers {
		p := s.layers.LayerPath(dg)
		if _, err := os.Stat(p); err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "layer %s of sandbox %s is missing", dg, sb.ID)
		}
		out = append(out, p)
	}
	return out, nil
}

// CaptureUpper stores sb's workspace changes as a new read-only layer. A
// running sandbox is frozen for the copy, so the layer is one instant.
func (s *Snapshots) CaptureUpper(ctx context.Context, sb *sandbox.Sandbox, running bool) (template.Layer, error) {
	rt, err := s.core.RuntimeFor(sb)
	if err != nil {
		return template.Layer{}, err
	}
	if running && canFreeze(ctx, rt) {
		if err := rt.Freeze(ctx, sb.ID); err != nil {
			return template.Layer{}, errs.Wrap(errs.Internal, err, "freeze %s for a consistent snapshot", sb.ID)
		}
		defer func() {
			if err := rt.Thaw(context.WithoutCancel(ctx), sb.ID); err != nil {
				s.log.Error("thaw after snapshot", "sandbox_id", sb.ID, "err", err)
			}
		}()
	}
	if exp, ok := rt.(upperExporter); ok && running && sb.Runtime == "runsc" {
		if l, ok, err := s.exportUpper(ctx, exp, sb); ok || err != nil {
			return l, err
		}
	}
	upper := rootfs.LayoutOf(s.core.SandboxDir(sb.ID)).Upper
	// The layer holds the ids as seen inside, so that it is a lower for any sandbox.
	m := s.core.UserNS(sb)
	return s.layers.ImportDir(ctx, func(dir string) error { return rootfs.CopyUpperUnshifted(ctx, upper, dir, m) })
}

// exportUpper asks runsc for the rootfs writes it keeps in its own
// in-sandbox overlay (--overlay2 root:memory|self). ok is false when the
// sandbox has no such overlay (--overlay2=none: writes reach the host upper
// dir, which the caller copies).
func (s *Snapshots) exportUpper(ctx context.Context, exp upperExporter, sb *sandbox.Sandbox) (template.Layer, bool, error) {
	tmp, err := os.CreateTemp(filepath.Join(s.cfg.DataDir, "snapshots"), ".upper-*.tar")
	if err != nil {
		return template.Layer{}, false, errs.Wrap(errs.Internal, err, "snapshot scratch file")
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := exp.ExportUpper(ctx, sb.ID, tmp.Name()); err != nil {
		if strings.Contains(err.Error(), "not an overlayfs") {
			return template.Layer{}, false, nil
		}
		return template.Layer{}, false, err
	}
	l, err := s.layers.ImportDir(ctx, func(dir string) error {
		f, err := os.Open(tmp.Name())
		if err != nil {
			return errs.Wrap(errs.Internal, err, "open upper tar")
		}
		defer f.Close()
		return rootfs.ExtractUpperTar(ctx, f, dir)
	})
	return l, true, err
}

// SnapshotRequest asks for a snapshot of a running sandbox.
type SnapshotRequest struct {
	Owner string // "" = admin
	Actor string
	ID    string
	Name  string
}

// Snapshot captures a running sandbox's workspace as a new layer; the
// sandbox keeps running (frozen for the copy only).
func (s *Snapshots) Snapshot(ctx context.Context, req SnapshotRequest) (store.Snapshot, error) {
	if req.Name != "" {
		if err := s.core.ValidTemplateName(req.Name); err != nil {
			return store.Snapshot{}, errs.Field("name", "snapshot names are 1-63 chars of lowercase letters, digits, '.', '_', '-', got %q", req.Name)
		}
	}
	unlock := s.core.Lock(req.ID)
	defer unlock()
	sb, err := s.core.Visible(ctx, req.Owner, req.ID)
	if err != nil {
		return store.Snapshot{}, err
	}
	return s.snapshotLocked(ctx, sb, req.Name, req.Actor, "")
}

// snapshotLocked captures sb (locked by the caller). memory is the path of
// a memory image that belongs with it, if any.
func (s *Snapshots) snapshotLocked(ctx context.Context, sb *sandbox.Sandbox, name, actor, memory string) (store.Snapshot, error) {
	if sb.State != sandbox.Running {
		return store.Snapshot{}, errs.E(errs.Conflict, "sandbox %s is %s; only a running sandbox can be snapshotted", sb.ID, sb.State)
	}
	release, err := s.core.ReserveSnapshot(ctx, sb.Owner) // owner's snapshot quota (quota.go)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer release()
	base, err := s.layerDigests(ctx, sb)
	if err != nil {
		return store.Snapshot{}, err
	}
	if err := os.MkdirAll(filepath.Join(s.cfg.DataDir, "snapshots"), 0o700); err != nil {
		return store.Snapshot{}, errs.Wrap(errs.Internal, err, "create snapshots dir")
	}
	start := time.Now()
	layer, err := s.CaptureUpper(ctx, sb, true)
	if err != nil {
		return store.Snapshot{}, err
	}
	return s.recordSnapshot(ctx, "", sb, name, actor, layer, base, memory, time.Since(start))
}

// recordSnapshot stores a snapshot record (id "" = a fresh one) and an event.
func (s *Snapshots) recordSnapshot(ctx context.Context, id string, sb *sandbox.Sandbox, name, actor string, layer template.Layer, base []string, memory string, took time.Duration) (store.Snapshot, error) {
	if id == "" {
		id = sandbox.NewID()
	}
	sn := store.Snapshot{
		ID: id, Owner: sb.Owner, Name: name, SourceSandbox: sb.ID, Template: sb.Template,
		TemplateID: sb.TemplateID, Runtime: sb.Runtime, Layers: append([]string{layer.Digest}, base...),
		MemoryPath: memory, CreatedAt: s.core.Now().UTC(),
		Extra: map[string]string{"layer_bytes": formatInt(layer.TarSize), "layer_entries": formatInt(layer.Entries),
			"capture_ms": formatInt(took.Milliseconds())},
	}
	if p := sb.Net.Policy; len(p) > 0 {
		sn.Extra[SnapshotPolicyKey] = string(p)
	}
	if err := s.core.Store().CreateSnapshot(ctx, sn); err != nil {
		if errs.Is(err, errs.AlreadyExists) {
			return store.Snapshot{}, errs.Field("name", "you already have a snapshot named %q", name)
		}
		return store.Snapshot{}, err
	}
	s.core.Event(ctx, sb, actor, "snapshot", "snapshot_taken", "", map[string]string{
		"snapshot": sn.ID, "layer": layer.Digest, "capture_ms": formatInt(took.Milliseconds())})
	s.log.Info("snapshot taken", "sandbox_id", sb.ID, "snapshot", sn.ID, "layer", layer.Digest, "ms", took.Milliseconds())
	return sn, nil
}

// GetSnapshot returns a snapshot visible to owner ("" = admin).
func (s *Snapshots) GetSnapshot(ctx context.Context, owner, id string) (store.Snapshot, error) {
	notFound := errs.E(errs.NotFound, "snapshot %q not found", id)
	if !sandbox.ValidID(id) {
		return store.Snapshot{}, notFound
	}
	sn, err := s.core.Store().GetSnapshot(ctx, id)
	if errs.Is(err, errs.NotFound) || (err == nil && owner != "" && sn.Owner != owner) {
		return store.Snapshot{}, notFound
	}
	return sn, err
}

// ListSnapshots lists owner's snapshots ("" = every owner).
func (s *Snapshots) ListSnapshots(ctx context.Context, owner string) ([]store.Snapshot, error) {
	return s.core.Store().ListSnapshots(ctx, owner)
}

// snapshotUsers are the live sandboxes started from snapshot id.
func (s *Snapshots) snapshotUsers(ctx context.Context, id string) ([]string, error) {
	all, _, err := s.core.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return nil, err
	}
	var users []string
	for _, sb := range all {
		if sb.State != sandbox.Deleted && sb.Lineage.Snapshot == id {
			users = append(users, sb.ID)
		}
	}
	return users, nil
}

// DeleteSnapshot removes a snapshot no sandbox uses, with its memory image
// and its own layer unless a template or another snapshot shares it.
func (s *Snapshots) DeleteSnapshot(ctx context.Context, owner, id string) error {
	sn, err := s.GetSnapshot(ctx, owner, id)
	if err != nil {
		return err
	}
	users, err := s.snapshotUsers(ctx, id)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return errs.E(errs.Conflict, "snapshot %s is used by %d sandbox(es): %s", id, len(users), strings.Join(users, ", "))
	}
	if err := s.core.Store().DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	removeWhenUnread(s.core, s.dir(id), sn.MemoryPath)
	if used, err := s.layerUsed(ctx, sn.Layers[0]); err == nil && !used {
		if err := s.layers.RemoveLayer(sn.Layers[0]); err != nil && !errs.Is(err, errs.NotFound) {
			s.log.Warn("remove snapshot layer", "snapshot", id, "err", err)
		}
	}
	return nil
}

// layerUsed reports whether a template, a snapshot or a sandbox uses layer dg.
func (s *Snapshots) layerUsed(ctx context.Context, dg string) (bool, error) {
	tpls, err := s.core.Store().ListTemplates(ctx)
	if err != nil {
		return true, err
	}
	for _, t := range tpls {
		if slices.Contains(t.Layers, dg) {
			return true, nil
		}
	}
	sns, err := s.core.Store().ListSnapshots(ctx, "")
	if err != nil {
		return true, err
	}
	for _, s := range sns {
		if slices.Contains(s.Layers, dg) {
			return true, nil
		}
	}
	all, _, err := s.core.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return true, err
	}
	for _, sb := range all {
		if slices.Contains(sb.Layers, dg) {
			return true, nil
		}
	}
	return false, nil
}

// TemplateFromSnapshot promotes a snapshot to a template named name.
func (s *Snapshots) TemplateFromSnapshot(ctx context.Context, owner, id, name string) (store.Template, error) {
	if err := s.core.ValidTemplateName(name); err != nil {
		return store.Template{}, err
	}
	sn, err := s.GetSnapshot(ctx, owner, id)
	if err != nil {
		return store.Template{}, err
	}
	if _, err := s.core.Store().GetTemplate(ctx, name); err == nil {
		return store.Template{}, errs.E(errs.AlreadyExists, "template %s already exists", name)
	}
	t := store.Template{Name: name, Layers: sn.Layers, State: store.TemplateReady, Source: "snapshot " + sn.ID}
	if src, err := s.core.Store().GetTemplate(ctx, sn.Template); err == nil {
		t.StartCmd, t.Env, t.Workdir, t.User, t.Resources = src.StartCmd, src.Env, src.Workdir, src.User, src.Resources
	}
	t.Fingerprint = s.core.Fingerprint(t)
	return s.core.Store().PutTemplate(ctx, t)
}

// FromSnapshot points a create request at snapshot snapID: it answers the
// template to use (the snapshot's; tpl names the requested one, "" = any)
// and the request's attrs with the snapshot's layers pinned as lowers and
// its network policy unless the request names one. Called before the
// request is normalized; a's slices are not changed.
func (s *Snapshots) FromSnapshot(ctx context.Context, owner, snapID, tpl string, a sandbox.Attrs) (string, sandbox.Attrs, error) {
	sn, err := s.GetSnapshot(ctx, owner, snapID)
	if errs.Is(err, errs.NotFound) {
		return "", a, errs.Field("from_snapshot", "unknown snapshot %q (see `berth snapshot ls`)", snapID)
	}
	if err != nil {
		return "", a, err
	}
	if tpl != "" && tpl != sn.Template {
		return "", a, errs.Field("template", "snapshot %s was taken from template %s; leave template empty or use %s", sn.ID, sn.Template, sn.Template)
	}
	a.Layers = slices.Clone(sn.Layers)
	a.Lineage.Snapshot = sn.ID
	if p := sn.Extra[SnapshotPolicyKey]; p != "" && len(a.Net.Policy) == 0 {
		a.Net.Policy = []byte(p) // the snapshot's network policy, unless the request names one
	}
	return sn.Template, a, nil
}

// lowersForSandbox is LowersFor with sb's template looked up (not needed
// when its layers are pinned).
func (s *Snapshots) lowersForSandbox(ctx context.Context, sb *sandbox.Sandbox) ([]string, error) {
	tpl, err := s.core.Store().GetTemplate(ctx, sb.Template)
	if err != nil && len(sb.Layers) == 0 {
		return nil, err
	}
	return s.LowersFor(sb, &tpl)
}

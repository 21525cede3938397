package daemon

import (
	"context"
	"os"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// RemoveTemplate deletes a template no sandbox or warm pool uses, then
// garbage-collects the layers nothing references any more. It returns the
// number of layers removed.
func (d *Daemon) RemoveTemplate(ctx context.Context, name string) (int, error) {
	if _, err := d.store.GetTemplate(ctx, name); err != nil {
		return 0, err
	}
	all, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{Template: name})
	if err != nil {
		return 0, err
	}
	var users []string
	for _, sb := range all {
		if sb.State != sandbox.Deleted && !IsPoolMember(sb) {
			users = append(users, sb.ID)
		}
	}
	if len(users) > 0 {
		return 0, errs.E(errs.Conflict, "template %s is used by %d sandbox(es): %s; remove them first",
			name, len(users), strings.Join(users, ", "))
	}
	specs, err := d.poolSpecs(ctx)
	if err != nil {
		return 0, err
	}
	if _, ok := specs[name]; ok {
		return 0, errs.E(errs.Conflict, "template %s has a warm pool; remove it first (berth pool rm %s)", name, name)
	}
	if err := d.store.DeleteTemplate(ctx, name); err != nil {
		return 0, err
	}
	d.log.Info("template removed", "template", name)
	return d.CollectLayers(ctx)
}

// CollectLayers removes every stored layer that no template, snapshot or
// sandbox record references and no mounted overlay uses; imports and builds
// in progress hold it off. It returns the number of layers removed.
func (d *Daemon) CollectLayers(ctx context.Context) (int, error) {
	w := d.work()
	w.gc.Lock()
	defer w.gc.Unlock()
	used := map[string]bool{}
	tpls, err := d.store.ListTemplates(ctx)
	if err != nil {
		return 0, err
	}
	for _, t := range tpls {
		for _, l := range t.Layers {
			used[l] = true
		}
	}
	sns, err := d.store.ListSnapshots(ctx, "")
	if err != nil {
		return 0, err
	}
	for _, s := range sns {
		for _, l := range s.Layers {
			used[l] = true
		}
	}
	all, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return 0, err
	}
	for _, sb := range all {
		if sb.State != sandbox.Deleted {
			for _, l := range sb.Layers {
				used[l] = true
			}
		}
	}
	// A sandbox of an older version of a rebuilt template runs on layers
	// no record names any more: its overlay mount still lists them.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, errs.Wrap(errs.Internal, err, "read mounts")
	}
	layers, err := d.templates.ListLayers()
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, l := range layers {
		if used[l.Digest] || strings.Contains(string(mounts), d.templates.LayerPath(l.Digest)) {
			continue
		}
		if err := d.templates.RemoveLayer(l.Digest); err != nil && !errs.Is(err, errs.NotFound) {
			d.log.Warn("garbage-collect layer", "digest", l.Digest, "err", err)
			continue
		}
		removed++
	}
	if removed > 0 {
		d.log.Info("layers garbage-collected", "removed", removed, "kept", len(layers)-removed)
	}
	return removed, nil
}

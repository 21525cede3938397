package template

import (
	"context"
	"os"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Remove deletes a template no sandbox or warm pool uses, then
// garbage-collects the layers nothing references any more. It returns the
// number of layers removed.
func (s *Service) Remove(ctx context.Context, name string) (int, error) {
	if _, err := s.store().GetTemplate(ctx, name); err != nil {
		return 0, err
	}
	users, err := s.core.TemplateUsers(ctx, name)
	if err != nil {
		return 0, err
	}
	if len(users) > 0 {
		return 0, errs.E(errs.Conflict, "template %s is used by %d sandbox(es): %s; remove them first",
			name, len(users), strings.Join(users, ", "))
	}
	pooled, err := s.core.HasPool(ctx, name)
	if err != nil {
		return 0, err
	}
	if pooled {
		return 0, errs.E(errs.Conflict, "template %s has a warm pool; remove it first (berth pool rm %s)", name, name)
	}
	if err := s.store().DeleteTemplate(ctx, name); err != nil {
		return 0, err
	}
	s.log.Info("template removed", "template", name)
	return s.CollectLayers(ctx)
}

// CollectLayers removes every stored layer that no template, snapshot or
// sandbox record references and no mounted overlay uses; imports and builds
// in progress hold it off. It returns the number of layers removed.
func (s *Service) CollectLayers(ctx context.Context) (int, error) {
	w := s.work()
	w.gc.Lock()
	defer w.gc.Unlock()
	used := map[string]bool{}
	tpls, err := s.store().ListTemplates(ctx)
	if err != nil {
		return 0, err
	}
	for _, t := range tpls {
		for _, l := range t.Layers {
			used[l] = true
		}
	}
	sns, err := s.store().ListSnapshots(ctx, "")
	if err != nil {
		return 0, err
	}
	for _, sn := range sns {
		for _, l := range sn.Layers {
			used[l] = true
		}
	}
	pinned, err := s.core.PinnedLayers(ctx)
	if err != nil {
		return 0, err
	}
	for l := range pinned {
		used[l] = true
	}
	// A sandbox of an older version of a rebuilt template runs on layers
	// no record names any more: its overlay mount still lists them.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, errs.Wrap(errs.Internal, err, "read mounts")
	}
	return s.collect(used, string(mounts))
}

// collect removes the stored layers neither in used nor named in mounts.
func (s *Service) collect(used map[string]bool, mounts string) (int, error) {
	layers, err := s.layers.ListLayers()
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, l := range layers {
		if used[l.Digest] || strings.Contains(mounts, s.layers.LayerPath(l.Digest)) {
			continue
		}
		if err := s.layers.RemoveLayer(l.Digest); err != nil && !errs.Is(err, errs.NotFound) {
			s.log.Warn("garbage-collect layer", "digest", l.Digest, "err", err)
			continue
		}
		removed++
	}
	if removed > 0 {
		s.log.Info("layers garbage-collected", "removed", removed, "kept", len(layers)-removed)
	}
	return removed, nil
}

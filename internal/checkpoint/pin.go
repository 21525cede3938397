package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// A sandbox pins the layers it boots on by digest (Attrs.Layers) for
// its whole life: a rebuilt template does not move it to other layers at its
// next start or disk resume, snapshots and forks of it use the pinned
// layers, and layer GC (CollectLayers) keeps them while the sandbox exists.
//
// Sandboxes from before pins existed are pinned when the daemon starts if
// their template still has the fingerprint they were created from, or, if
// it was rebuilt meanwhile, to the layers their mounted overlay names. One
// with neither cannot be pinned to what it ran on (nothing recorded it); it
// says so in an event, and its next boot moves it to the template's current
// layers, recorded as an event too.

// WithPinnedLayers returns a with the template's layers pinned unless
// the request already names its own (a snapshot's, a build step's).
func WithPinnedLayers(a sandbox.Attrs, tpl *store.Template) sandbox.Attrs {
	if len(a.Layers) > 0 || tpl == nil || len(tpl.Layers) == 0 {
		return a
	}
	a.Layers = slices.Clone(tpl.Layers)
	return a
}

// PinLegacy pins the layers of a sandbox created before pins existed, at
// daemon start (Reconcile), when its template still matches.
func (s *Snapshots) PinLegacy(ctx context.Context, sb *sandbox.Sandbox) error {
	if sb.State == sandbox.Deleted || len(sb.Layers) > 0 || sb.LayersUnpinned != "" {
		return nil
	}
	tpl, err := s.core.Store().GetTemplate(ctx, sb.Template)
	if err != nil && !errs.Is(err, errs.NotFound) {
		return err
	}
	reason, layers := "", tpl.Layers
	switch {
	case err == nil && tpl.Fingerprint == sb.TemplateID:
		if len(layers) == 0 {
			return nil
		}
	default:
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		if l, ok := mountedLayers(string(mi), rootfs.LayoutOf(s.core.SandboxDir(sb.ID)).RootFS, s.layers.Dir()); ok {
			layers = l
			break
		}
		reason = "template " + sb.Template + " is gone"
		if err == nil {
			reason = "template " + sb.Template + " was rebuilt (fingerprint " + sb.TemplateID + ", now " + tpl.Fingerprint + ") before this sandbox's layers were pinned"
		}
	}
	out, err := s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		if reason != "" {
			s.LayersUnpinned = reason
		} else {
			s.Layers = slices.Clone(layers)
		}
		return nil
	})
	if err != nil {
		return err
	}
	*sb = *out
	if reason != "" {
		s.core.Event(ctx, sb, "berth", "layers", "layers_unpinned", reason+
			"; snapshots and forks are refused until its next boot, which moves it to the template's current layers", nil)
		return nil
	}
	s.log.Info("pinned the layers of a sandbox created before layer pins", "sandbox_id", sb.ID, "template", sb.Template)
	return nil
}

// PinForBoot makes sure sb (about to boot over tpl) has pinned layers. A
// legacy sandbox that could not be pinned moves to the template's current
// layers here, explicitly: its pin, its TemplateID and an event say so.
func (s *Snapshots) PinForBoot(ctx context.Context, sb *sandbox.Sandbox, tpl *store.Template) error {
	if len(sb.Layers) > 0 || tpl == nil || len(tpl.Layers) == 0 {
		return nil
	}
	from := sb.TemplateID
	out, err := s.core.Store().UpdateSandbox(ctx, sb.ID, func(s *sandbox.Sandbox) error {
		s.Layers, s.LayersUnpinned = slices.Clone(tpl.Layers), ""
		s.TemplateID = tpl.Fingerprint
		return nil
	})
	if err != nil {
		return err
	}
	sb.Attrs, sb.TemplateID = out.Attrs, out.TemplateID
	if from != tpl.Fingerprint {
		s.core.Event(ctx, sb, "berth", "layers", "layers_rebased",
			"booting on the current layers of template "+tpl.Name+": this sandbox predates layer pins and its template was rebuilt",
			map[string]string{"from_fingerprint": from, "to_fingerprint": tpl.Fingerprint})
	}
	return nil
}

// mountedLayers reads the layer digests (top first) of the overlay mounted
// at mountPoint from mountinfo, if every lower is a layer in layerDir.
func mountedLayers(mountinfo, mountPoint, layerDir string) ([]string, bool) {
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || g[0] != "overlay" || f[4] != mountPoint {
			continue
		}
		for _, opt := range strings.Split(g[2], ",") {
			v, ok := strings.CutPrefix(opt, "lowerdir=")
			if !ok {
				continue
			}
			var out []string
			for _, p := range strings.Split(v, ":") {
				if filepath.Dir(p) != filepath.Clean(layerDir) {
					return nil, false
				}
				out = append(out, filepath.Base(p))
			}
			return out, len(out) > 0
		}
	}
	return nil, false
}

package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"regexp"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

var templateNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidTemplateName checks a template name.
func ValidTemplateName(name string) error {
	if !templateNameRe.MatchString(name) {
		return errs.Field("name", "template names are 1-63 chars of lowercase letters, digits, '.', '_', '-', got %q", name)
	}
	return nil
}

// fingerprint of a template is the hash of its ordered layers and defaults.
func fingerprint(t store.Template) string {
	h := sha256.New()
	io.WriteString(h, strings.Join(t.Layers, ","))
	io.WriteString(h, "\x00"+strings.Join(t.StartCmd, "\x00")+"\x00"+t.Workdir+"\x00"+t.User)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// ImportTemplate stores a rootfs tarball as a one-layer template.
func (d *Daemon) ImportTemplate(ctx context.Context, name string, r io.Reader, source string) (store.Template, error) {
	if err := ValidTemplateName(name); err != nil {
		return store.Template{}, err
	}
	prev, _ := d.store.GetTemplate(ctx, name)
	_, _ = d.store.PutTemplate(ctx, store.Template{Name: name, State: store.TemplateBuilding, Progress: "importing", Source: source,
		Layers: prev.Layers, Fingerprint: prev.Fingerprint, CreatedAt: prev.CreatedAt})
	layer, err := d.templates.ImportTar(ctx, r, func(p template.Progress) {})
	if err != nil {
		t := store.Template{Name: name, State: store.TemplateFailed, Error: err.Error(), Source: source}
		_, _ = d.store.PutTemplate(context.WithoutCancel(ctx), t)
		return store.Template{}, err
	}
	t := store.Template{Name: name, Layers: []string{layer.Digest}, State: store.TemplateReady, Source: source}
	t.Fingerprint = fingerprint(t)
	return d.store.PutTemplate(ctx, t)
}

// EnsureDefaultTemplate builds the default template in the background when
// it is missing, with progress visible in `berth template ls`.
func (d *Daemon) EnsureDefaultTemplate(cacheDir string) {
	ctx := d.bg
	if t, err := d.store.GetTemplate(ctx, d.cfg.DefaultTemplate); err == nil && t.State == store.TemplateReady {
		if _, err := d.layersOf(&t); err == nil {
			return
		}
	}
	d.GoBackground("default-template", func(ctx context.Context) {
		name := d.cfg.DefaultTemplate
		put := func(state, progress, errText string) {
			if _, err := d.store.PutTemplate(context.WithoutCancel(ctx), store.Template{Name: name, State: state, Progress: progress,
				Error: errText, Source: "debootstrap bookworm"}); err != nil {
				d.log.Error("template state", "template", name, "err", err)
			}
		}
		put(store.TemplateBuilding, "starting", "")
		d.log.Info("preparing the default template (debootstrap on the first run, then from the cache)", "template", name)
		tarPath, err := template.BuildDefault(ctx, cacheDir, func(p template.Progress) {
			put(store.TemplateBuilding, p.Phase+": "+p.Message, "")
		})
		if err != nil {
			d.log.Error("default template build failed", "template", name, "err", err)
			put(store.TemplateFailed, "", err.Error())
			return
		}
		put(store.TemplateBuilding, "import: "+tarPath, "")
		layer, err := d.templates.ImportFile(ctx, tarPath, func(p template.Progress) {})
		if err != nil {
			put(store.TemplateFailed, "", err.Error())
			return
		}
		t := store.Template{Name: name, Layers: []string{layer.Digest}, State: store.TemplateReady, Source: "debootstrap bookworm"}
		t.Fingerprint = fingerprint(t)
		if _, err := d.store.PutTemplate(context.WithoutCancel(ctx), t); err != nil {
			d.log.Error("template state", "template", name, "err", err)
			return
		}
		d.log.Info("default template ready", "template", name, "layer", layer.Digest)
	})
}

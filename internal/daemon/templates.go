package daemon

import (
	"context"
	"slices"
	"time"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
)

// The template domain (import, pull, Dockerfile build, remove, layer GC)
// is template.Service; this file is the core's side of its narrow
// interface.

// Names kept for callers of the daemon package; the types live in
// internal/template.
type (
	PullRequest   = template.PullRequest
	BuildRequest  = template.BuildRequest
	BuildProgress = template.BuildProgress
)

// BuildOwner owns the short-lived sandboxes that run Dockerfile RUN steps.
const BuildOwner = template.BuildOwner

// ValidTemplateName checks a template name.
func ValidTemplateName(name string) error { return template.ValidName(name) }

// fingerprint of a template is the hash of its ordered layers and defaults.
func fingerprint(t store.Template) string { return template.FingerprintOf(t) }

// Templates is the template service (import, pull, build, remove, GC).
func (d *Daemon) Templates() *template.Service { return d.tplSvc }

// templateCore is the core as template.Core sees it: the primitives are
// the Daemon's (embedded); the build-sandbox steps, workspace capture and
// the usage queries below are defined on the adapter only, so they are no
// API of the Daemon.
type templateCore struct{ *Daemon }

var _ template.Core = templateCore{}

// OpenStream marks a client stream on sandbox id (admission.Service.OpenStream).
func (d templateCore) OpenStream(id string) (done func()) { return d.adm.OpenStream(id) }

// HasPool reports whether template name has a warm pool.
func (d templateCore) HasPool(ctx context.Context, name string) (bool, error) {
	return d.poolSvc.Has(ctx, name)
}

// StartBuildSandbox starts a sandbox on the given layers for one RUN step
// .
func (d templateCore) StartBuildSandbox(ctx context.Context, layers []string, network string, note func(msg string)) (*sandbox.Sandbox, error) {
	req := CreateRequest{Owner: BuildOwner, Network: network, Attrs: sandbox.Attrs{Layers: slices.Clone(layers)}}
	if network == "" {
		req.Network = "allow-all" // builds install packages
		if !d.net.Enabled() {
			req.Network = ""
			note("networking is disabled on this server: RUN has no network")
		}
	}
	if err := prepareNetwork(ctx, d.net, &req); err != nil {
		return nil, err
	}
	now := d.cfg.Now()
	tpl := &store.Template{Name: "build", Layers: layers, State: store.TemplateReady}
	sb := &sandbox.Sandbox{
		ID: sandbox.NewID(), Owner: BuildOwner, Template: "build", TemplateID: fingerprint(*tpl),
		Runtime: d.cfg.DefaultRuntime, State: sandbox.Creating, Labels: map[string]string{"berth.build": "true"},
		Resources: d.cfg.DefaultResources, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		ExpiryAction: sandbox.ExpireDelete, Attrs: req.Attrs,
	}
	sb.AccessTokenHash = d.auth.EnvdTokenHash(sb.ID, sb.Owner)
	if err := d.adm.Admit(ctx, sb); err != nil {
		return nil, err
	}
	note("starting build sandbox " + sb.ID)
	unlock := d.Lock(sb.ID)
	err := d.boot(ctx, sb, tpl)
	var out *sandbox.Sandbox
	if err == nil {
		out, err = d.Transition(ctx, sb.ID, sandbox.Running, "build", "created", "", func(s *sandbox.Sandbox) error {
			s.StartedAt = d.cfg.Now()
			return nil
		})
	}
	if err != nil {
		d.fail(ctx, sb, "build_boot_failed", err)
	}
	unlock()
	if err != nil {
		_ = d.delete(context.WithoutCancel(ctx), "", sb.ID, "build", "build_boot_failed")
		return nil, err
	}
	return out, nil
}

// RemoveBuildSandbox deletes a build step's sandbox.
func (d templateCore) RemoveBuildSandbox(ctx context.Context, id string) error {
	return d.delete(ctx, "", id, "build", "build_step_done")
}

// CaptureWorkspace stores a running sandbox's workspace as a layer; the
// caller holds its lock.
func (d templateCore) CaptureWorkspace(ctx context.Context, sb *sandbox.Sandbox) (template.Layer, error) {
	return d.snaps.CaptureUpper(ctx, sb, true)
}

// TemplateUsers lists the sandboxes that keep template name from being
// removed: every one not deleted, except unclaimed pool members.
func (d templateCore) TemplateUsers(ctx context.Context, name string) ([]string, error) {
	all, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{Template: name})
	if err != nil {
		return nil, err
	}
	var users []string
	for _, sb := range all {
		if sb.State != sandbox.Deleted && !IsPoolMember(sb) {
			users = append(users, sb.ID)
		}
	}
	return users, nil
}

// PinnedLayers is every layer a sandbox record or a sandbox's timeline
// (checkpoints, heads) pins.
func (d templateCore) PinnedLayers(ctx context.Context) (map[string]bool, error) {
	used, err := d.tl.PinnedLayers(ctx)
	if err != nil {
		return nil, err
	}
	all, _, err := d.store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		if sb.State != sandbox.Deleted {
			for _, l := range sb.Layers {
				used[l] = true
			}
		}
	}
	return used, nil
}

// withTemplateEnv is a sandbox's environment: the template's (image config
// Env, Dockerfile ENV) overridden by the create request's.
func withTemplateEnv(tpl *store.Template, env map[string]string) map[string]string {
	if tpl == nil || len(tpl.Env) == 0 {
		return env
	}
	out := make(map[string]string, len(tpl.Env)+len(env))
	for k, v := range tpl.Env {
		out[k] = v
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

package daemon

import (
	"context"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// checkpointCore is the core as checkpoint.Core sees it. The primitives
// are the Daemon's own exported methods; the rest are the steps of a boot
// that a restore or fork repeats, kept unexported on the Daemon so they do
// not become API for every handler (and the Daemon stays a small type):
// this adapter is their one window to the checkpoint services.
type checkpointCore struct{ d *Daemon }

var _ checkpoint.Core = checkpointCore{}

func (c checkpointCore) Lock(id string) func() { return c.d.Lock(id) }
func (c checkpointCore) Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	return c.d.Visible(ctx, owner, id)
}
func (c checkpointCore) TransitionLeases(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error) {
	return c.d.TransitionLeases(ctx, id, to, actor, reason, msg, fn, ch)
}

func (c checkpointCore) Transition(ctx context.Context, id string, to sandbox.State, actor, reason, msg string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	return c.d.Transition(ctx, id, to, actor, reason, msg, fn)
}
func (c checkpointCore) Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string) {
	c.d.Event(ctx, sb, actor, typ, reason, msg, data)
}
func (c checkpointCore) RuntimeFor(sb *sandbox.Sandbox) (runtime.Runtime, error) {
	return c.d.RuntimeFor(sb)
}
func (c checkpointCore) Runtimes() map[string]runtime.Runtime { return c.d.Runtimes() }
func (c checkpointCore) SandboxDir(id string) string          { return c.d.SandboxDir(id) }
func (c checkpointCore) GoBackground(name string, fn func(context.Context)) {
	c.d.GoBackground(name, fn)
}
func (c checkpointCore) Store() store.Store { return c.d.Store() }
func (c checkpointCore) Now() time.Time     { return c.d.Now() }

func (c checkpointCore) Boot(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.boot(ctx, sb, nil)
}
func (c checkpointCore) Halt(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.halt(ctx, sb)
}
func (c checkpointCore) Fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error) {
	c.d.fail(ctx, sb, reason, cause)
}
func (c checkpointCore) Spec(sb *sandbox.Sandbox, tpl *store.Template, root string) runtime.Spec {
	return c.d.spec(sb, tpl, root)
}
func (c checkpointCore) CreateChild(ctx context.Context, r checkpoint.ChildRequest) (*sandbox.Sandbox, error) {
	return c.d.Create(ctx, CreateRequest{
		Owner: r.Owner, Actor: r.Actor, Runtime: r.Runtime, TTL: r.TTL, ExpiryAction: r.ExpiryAction,
		Resources: r.Resources, Labels: r.Labels, Env: r.Env,
		AutoResume: r.AutoResume, FromSnapshot: r.FromSnapshot, Attrs: r.Attrs,
	})
}
func (c checkpointCore) Admit(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.adm.Admit(ctx, sb)
}
func (c checkpointCore) CheckAdmit(ctx context.Context, owner string, r sandbox.Resources) error {
	return c.d.adm.CheckAdmit(ctx, owner, r)
}
func (c checkpointCore) ReserveSnapshot(ctx context.Context, owner string) (func(), error) {
	return c.d.adm.ReserveSnapshot(ctx, owner)
}
func (c checkpointCore) AccessTokenHash(id, owner string) string {
	return c.d.auth.EnvdTokenHash(id, owner)
}

func (c checkpointCore) AgentClient(id string) *agentapi.Client { return c.d.AgentClient(id) }
func (c checkpointCore) Channel(id string) (*agentapi.Channel, error) {
	return c.d.chans.get(id)
}
func (c checkpointCore) OpenChannel(id string) (*agentapi.Channel, error) {
	return c.d.chans.open(id)
}
func (c checkpointCore) DropChannel(id string)                    { c.d.chans.drop(id) }
func (c checkpointCore) AgentKey(id string) []byte                { return c.d.chans.agentKey(id) }
func (c checkpointCore) EnsureChanDir(id string) error            { return c.d.chans.ensureDir(id) }
func (c checkpointCore) WriteEnv(sb *sandbox.Sandbox) error       { return c.d.chans.writeEnv(sb) }
func (c checkpointCore) UserNS(sb *sandbox.Sandbox) *rootfs.IDMap { return c.d.userns.of(sb) }
func (c checkpointCore) TemplateLowers(tpl *store.Template) ([]string, error) {
	return c.d.templates.Lowers(tpl.Name, tpl.Layers) // a template's layer digests as host paths, top first
}

// The root filesystem: the core's Config.Filesystem, as boot uses it
// (overlayfs, or a plain directory in unit tests).
func (c checkpointCore) PrepareRoot(ctx context.Context, dir string, lowers []string, diskMiB int64, m *rootfs.IDMap) (string, error) {
	return c.d.cfg.Filesystem.Prepare(ctx, dir, lowers, diskMiB, m)
}
func (c checkpointCore) RemountRoot(ctx context.Context, dir string, lowers []string, m *rootfs.IDMap) (string, error) {
	return c.d.cfg.Filesystem.Remount(ctx, dir, lowers, m)
}
func (c checkpointCore) TeardownRoot(ctx context.Context, dir string) error {
	return c.d.cfg.Filesystem.Teardown(ctx, dir)
}

func (c checkpointCore) PickUserNS(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.userns.pick(ctx, sb)
}
func (c checkpointCore) ShareSandboxDir(sb *sandbox.Sandbox) error {
	return c.d.userns.share(sb, c.d.SandboxDir(sb.ID))
}
func (c checkpointCore) NetUp(ctx context.Context, sb *sandbox.Sandbox, root string) error {
	return c.d.net.Up(ctx, sb, root)
}
func (c checkpointCore) NetDown(ctx context.Context, sb *sandbox.Sandbox) error {
	return c.d.net.Down(ctx, sb)
}
func (c checkpointCore) NetTrust(sb *sandbox.Sandbox, root string) { c.d.net.Trust(sb, root) }
func (c checkpointCore) NetworkInherit(parent *sandbox.Sandbox) sandbox.NetState {
	return inheritedNet(parent)
}
func (c checkpointCore) ValidTemplateName(name string) error { return ValidTemplateName(name) }
func (c checkpointCore) Fingerprint(t store.Template) string { return fingerprint(t) }

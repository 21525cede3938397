package daemon

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/checkpoint"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/statehook"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/trace"
	"github.com/berth-dev/berth/internal/undo"
)

// agentMount is where the installed agent directory is bind-mounted
// (read-only); agentInSandbox is the agent binary inside it.
const (
	agentMount     = "/.berth"
	agentInSandbox = agentMount + "/berth-agent"
)

var envKeyOK = func(k string) bool {
	if k == "" || strings.ContainsAny(k, "=\x00") {
		return false
	}
	return true
}

// normalize fills defaults and validates a create request; errors name the field.
func (d *Daemon) normalize(ctx context.Context, req *CreateRequest) (*store.Template, error) {
	if req.Owner == "" {
		return nil, errs.Field("owner", "must be set")
	}
	if req.Template == "" {
		req.Template = d.cfg.DefaultTemplate
	}
	tplv, err := d.store.GetTemplate(ctx, req.Template)
	tpl := &tplv
	if err != nil {
		if errs.Is(err, errs.NotFound) {
			return nil, errs.Field("template", "unknown template %q (see `berth template ls`)", req.Template)
		}
		return nil, err
	}
	if tpl.State != "ready" {
		return nil, errs.Field("template", "template %q is %s, not ready: %s", req.Template, tpl.State, tpl.Progress+tpl.Error)
	}
	if req.Runtime == "" {
		req.Runtime = d.ckpt.DefaultRuntime(ctx, d.cfg.DefaultRuntime, req.Workstation) // internal/checkpoint
	}
	if _, ok := d.runtimes[req.Runtime]; !ok {
		names := make([]string, 0, len(d.runtimes))
		for n := range d.runtimes {
			names = append(names, n)
		}
		return nil, errs.Field("runtime", "unknown runtime %q; available: %s", req.Runtime, strings.Join(names, ", "))
	}
	if req.TTL < 0 {
		return nil, errs.Field("ttl", "must be positive")
	}
	if req.TTL == 0 {
		req.TTL = d.cfg.DefaultTTL
	}
	if req.TTL > d.cfg.MaxTTL {
		return nil, errs.Field("ttl", "must be at most %s", d.cfg.MaxTTL)
	}
	if req.ExpiryAction == "" {
		req.ExpiryAction = sandbox.ExpireStop
		if req.Workstation {
			req.ExpiryAction = sandbox.ExpirePause
		}
	}
	if err := sandbox.ValidExpiryAction(req.ExpiryAction); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateResources(req.Resources, d.cfg.MaxResources); err != nil {
		return nil, err
	}
	r, def := &req.Resources, d.cfg.DefaultResources
	if r.CPUMillis == 0 {
		r.CPUMillis = def.CPUMillis
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = def.MemoryMiB
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = def.DiskMiB
	}
	if r.Pids == 0 {
		r.Pids = def.Pids
	}
	if err := sandbox.ValidateLabels("labels", req.Labels); err != nil {
		return nil, err
	}
	for k := range req.Env {
		if !envKeyOK(k) {
			return nil, errs.Field("env", "invalid variable name %q", k)
		}
	}
	return tpl, nil
}

// Create makes a sandbox and returns once its agent answers (ready).
func (d *Daemon) Create(ctx context.Context, req CreateRequest) (_ *sandbox.Sandbox, err error) {
	ph := phases.Start("create")
	ctx, span := trace.Phase(ctx, "sandbox.create")
	defer span.EndErr(&err)
	if req.FromSnapshot != "" { // the snapshot's template and layers (internal/checkpoint)
		tpl, attrs, err := d.snaps.FromSnapshot(ctx, req.Owner, req.FromSnapshot, req.Template, req.Attrs)
		if err != nil {
			return nil, err
		}
		req.Template, req.Attrs = tpl, attrs
	}
	if req.ID != "" && !sandbox.ValidID(req.ID) {
		return nil, errs.Field("id", "must be 1-64 lowercase letters and digits, got %q", req.ID)
	}
	tpl, err := d.normalize(ctx, &req)
	if err != nil {
		return nil, err
	}
	release, err := d.adm.AdmitClaim(ctx, req.Owner, req.Resources, req.Attrs.IdlePolicy) // a pool claim is admitted under the quota lock (quota.go)
	if err != nil {
		return nil, err
	}
	var claimed *sandbox.Sandbox
	hit := false
	if req.ID == "" { // a pool member has an id of its own
		claimed, hit = claimFromPool(ctx, d.poolSvc, req, tpl, d.adoptable(req))
	}
	release()
	if hit { // warm pool hit (pool.go)
		span.Set(append(trace.Sandbox(claimed), trace.Bool("pool.hit", true))...)
		return claimed, nil
	}
	if err := prepareNetwork(ctx, d.net, &req); err != nil {
		return nil, err
	}
	now := d.cfg.Now()
	id := req.ID
	if id == "" {
		id = sandbox.NewID()
	}
	sb := &sandbox.Sandbox{
		ID: id, Owner: req.Owner, Template: tpl.Name, TemplateID: tpl.Fingerprint,
		Runtime: req.Runtime, State: sandbox.Creating, Labels: req.Labels, Env: withTemplateEnv(tpl, req.Env),
		Resources: req.Resources, CreatedAt: now, ExpiresAt: now.Add(req.TTL),
		ExpiryAction: req.ExpiryAction, AutoResume: req.AutoResume,
		Attrs: checkpoint.WithPinnedLayers(req.Attrs, tpl), // the layers are the sandbox's for life
	}
	if req.ID != "" && d.cfg.ClusterNode != "" { // the node agent mirrors and reconciles these
		sb.Attrs.Cluster.Node = d.cfg.ClusterNode
		if sb.Attrs.Cluster.BoundAt.IsZero() {
			sb.Attrs.Cluster.BoundAt = now
		}
	} else if cl := d.adoptable(req); cl.Node != "" { // a warm hit that raced away: cold, same binding
		sb.Attrs.Cluster = cl
	}
	sb.AccessTokenHash = d.auth.EnvdTokenHash(sb.ID, sb.Owner)
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	d.userns.preset(sb) // recorded with the intent below, not in a write of its own
	span.Set(trace.Sandbox(sb)...)
	actor := req.Actor
	if actor == "" {
		actor = req.Owner
	}
	// Intent first: a crash from here on leaves a "creating" row that
	// reconciliation finishes or cleans up.
	if err := d.adm.Admit(ctx, sb); err != nil { // quota check + intent, under one lock (quota.go)
		return nil, err
	}
	unlock := d.Lock(sb.ID)
	defer unlock()

	start := time.Now()
	ph.Mark("before_boot")
	if err := d.boot(ctx, sb, tpl); err != nil {
		d.fail(ctx, sb, "create_failed", err)
		return nil, err
	}
	ph.Mark("boot")
	out, err := d.Transition(ctx, sb.ID, sandbox.Running, actor, "created", "", func(s *sandbox.Sandbox) error {
		s.StartedAt = d.cfg.Now()
		return nil
	})
	if err != nil {
		d.fail(ctx, sb, "create_failed", err)
		return nil, err
	}
	ph.Mark("commit")
	ph.Log(ctx, d.log, sb.ID, nil)
	d.adm.ObserveCreate(d.cfg.Now().Sub(now))
	d.log.InfoContext(ctx, "sandbox created", "sandbox_id", sb.ID, "owner", sb.Owner, "template", sb.Template,
		"runtime", sb.Runtime, "ms", time.Since(start).Milliseconds())
	if req.FromSnapshot != "" { // an older state of the snapshot's source, in a new sandbox
		if sn, err := d.snaps.GetSnapshot(ctx, req.Owner, req.FromSnapshot); err == nil {
			_ = d.hooks.Fire(ctx, statehook.Event{Phase: statehook.Restored, Sandbox: out, Actor: actor,
				From: sn.SourceSandbox, Snapshot: sn.ID, PointAt: sn.CreatedAt})
		}
	}
	return out, nil
}

// adoptable is the cluster binding of a signed create that named no id
// (zero otherwise): this node, and AdoptFrom, because its object comes
// from the replica only after the answer.
func (d *Daemon) adoptable(req CreateRequest) sandbox.ClusterState {
	if !req.ClusterAdopt || req.ID != "" || d.cfg.ClusterNode == "" {
		return sandbox.ClusterState{}
	}
	now := d.cfg.Now().UTC()
	return sandbox.ClusterState{Node: d.cfg.ClusterNode, BoundAt: now, AdoptFrom: now}
}

// fail tears down a sandbox's runtime resources and records it as failed.
func (d *Daemon) fail(ctx context.Context, sb *sandbox.Sandbox, reason string, cause error) {
	tctx, cancel := teardownCtx(ctx)
	defer cancel()
	if err := d.halt(tctx, sb); err != nil {
		d.log.Error("teardown after failure", "sandbox_id", sb.ID, "err", err)
	}
	msg := errs.Short(cause)
	if _, err := os.Stat(filepath.Join(d.SandboxDir(sb.ID), "disk.img")); err == nil {
		msg += "; " + recoverHint(sb.ID)
	}
	if _, err := d.Transition(tctx, sb.ID, sandbox.Failed, "berth", reason, msg, nil); err != nil {
		d.log.Error("record failure", "sandbox_id", sb.ID, "err", err)
	}
}

// recoverHint tells a user how to bring back a failed sandbox whose
// workspace is intact.
func recoverHint(id string) string {
	return "its workspace is kept: `berth start " + id + "` boots it again"
}

// teardownTimeout bounds the undo of a failed boot, as teardownCtx does.
const teardownTimeout = 60 * time.Second

// boot mounts the sandbox's filesystem (creating its workspace the first
// time), starts PID 1 and waits for the agent. Each step registers its undo.
func (d *Daemon) boot(ctx context.Context, sb *sandbox.Sandbox, tpl *store.Template) (err error) {
	tBoot := time.Now()
	ctx, span := trace.Phase(ctx, "sandbox.boot", trace.Sandbox(sb)...)
	defer span.EndErr(&err)
	rt, err := d.RuntimeFor(sb)
	if err != nil {
		return err
	}
	if tpl == nil {
		t, err := d.store.GetTemplate(ctx, sb.Template)
		if err != nil {
			return errs.Reclassify(errs.FailedPrecondition, err, "template %s", sb.Template)
		}
		tpl = &t
	}
	if err := d.snaps.PinForBoot(ctx, sb, tpl); err != nil {
		return err
	}
	lowers, err := d.snaps.LowersFor(sb, tpl)
	if err != nil {
		return err
	}
	dir := d.SandboxDir(sb.ID)
	_, statErr := os.Stat(filepath.Join(dir, "disk.img"))
	if statErr != nil { // a fresh workspace: decide its user namespace first
		if err := d.userns.pick(ctx, sb); err != nil {
			return err
		}
	}
	if err := d.chans.ensureDir(sb.ID); err != nil {
		return err
	}
	if err := d.userns.share(sb, d.SandboxDir(sb.ID)); err != nil {
		return err
	}
	var cleanup undo.Stack
	defer cleanup.Unwind(ctx, teardownTimeout, &err)
	t0 := time.Now()
	// The network namespace and the filesystem are independent: attach the
	// one while the other is mounted. A runtime that only joins the
	// namespace (runc) starts once it exists; the rest of the attach runs
	// beside the start (hostnet.Starting).
	late := !runtime.ReadsNetworkAtStart(rt)
	var up *hostnet.Starting
	netErr := make(chan error, 1)
	go func() {
		netErr <- trace.Do(ctx, "boot.net", func(ctx context.Context) error {
			if late {
				var err error
				up, err = d.net.Begin(ctx, sb)
				return err
			}
			return d.net.Up(ctx, sb, "")
		})
	}()
	var root string
	fsCtx, fsSpan := trace.Phase(ctx, "boot.fs")
	if statErr == nil {
		root, err = d.cfg.Filesystem.Remount(fsCtx, dir, lowers, d.userns.of(sb))
	} else {
		root, err = d.cfg.Filesystem.Prepare(fsCtx, dir, lowers, sb.Resources.DiskMiB, d.userns.of(sb))
	}
	fsSpan.End(err)
	t1 := time.Now()
	nerr := <-netErr
	t2 := time.Now()
	if nerr == nil {
		if up != nil {
			cleanup.Push(up.Undo)
		} else {
			cleanup.Push(func(c context.Context) error { return d.net.Down(c, sb) })
		}
	}
	if err != nil {
		return errors.Join(errs.Wrap(errs.Internal, errs.Hide(err, errs.Internal, errs.NotFound), "prepare filesystem"), nerr)
	}
	cleanup.Push(func(c context.Context) error { return d.cfg.Filesystem.Teardown(c, dir) })
	if nerr != nil {
		return nerr
	}
	d.net.Trust(sb, root)
	if err := d.chans.writeEnv(sb); err != nil {
		return err
	}
	// The daemon listens first; the agent dials as soon as it starts.
	ch, err := d.chans.open(sb.ID)
	if err != nil {
		return err
	}
	cleanup.Push(func(context.Context) error { d.chans.drop(sb.ID); return nil })
	spec := d.spec(sb, tpl, root)
	var finished chan error
	if up != nil {
		spec.NetNSPath = up.NetNSPath()
		spec.Mounts = append(spec.Mounts, up.Mounts()...) // d.net.Mounts adds them once attached
		finished = make(chan error, 1)
		go func() { finished <- trace.Do(ctx, "boot.net_finish", up.Finish) }()
	}
	tRun := time.Now()
	runErr := trace.Do(ctx, "boot.runtime", func(ctx context.Context) error { return rt.Run(ctx, spec) })
	if runErr == nil {
		cleanup.Push(func(c context.Context) error { return rt.Delete(c, sb.ID) })
	}
	t3 := time.Now()
	var netFinish time.Duration
	if finished != nil {
		ferr := <-finished
		netFinish = time.Since(t3)
		if ferr != nil && runErr == nil {
			return ferr
		}
	}
	if runErr != nil {
		return errs.Wrap(errs.Internal, errs.Hide(runErr, errs.Internal, errs.NotFound), "start sandbox")
	}
	t4 := time.Now()

	wctx, cancel := context.WithTimeout(ctx, d.cfg.ReadyTimeout)
	defer cancel()
	wctx, readySpan := trace.Phase(wctx, "boot.agent_ready")
	_, err = ch.Client().WaitReady(wctx, 2*time.Millisecond)
	readySpan.End(err)
	if err != nil {
		return errs.Reclassify(errs.Unavailable, err, "agent did not become ready within %s", d.cfg.ReadyTimeout)
	}
	runStartCommand(ctx, d, sb, tpl)
	d.log.DebugContext(ctx, "sandbox booted", "sandbox_id", sb.ID, "runtime", sb.Runtime,
		"pre_ms", ms(t0.Sub(tBoot)), "fs_ms", ms(t1.Sub(t0)), "net_wait_ms", ms(t2.Sub(t1)), "chan_ms", ms(tRun.Sub(t2)),
		"run_ms", ms(t3.Sub(tRun)), "net_finish_wait_ms", ms(netFinish), "ready_ms", ms(time.Since(t4)))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// spec computes the runtime spec for a sandbox: pure data.
func (d *Daemon) spec(sb *sandbox.Sandbox, tpl *store.Template, root string) runtime.Spec {
	// The channel key is PID 1's alone: the config is host-only, and the
	// agent passes it to none of its children (a sandbox root reading
	// /proc/1/environ learns its own sandbox's key, nothing more).
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"BERTH_SANDBOX_ID=" + sb.ID,
		"BERTH_AGENT_KEY=" + hex.EncodeToString(d.chans.agentKey(sb.ID)),
	}
	return runtime.Spec{
		ID: sb.ID, BundleDir: d.SandboxDir(sb.ID), RootFS: root, Hostname: sb.ID,
		Args: d.agent.Args, Env: env, Cwd: "/",
		Mounts: append([]runtime.Mount{
			{Source: d.agent.Dir, Target: agentMount, ReadOnly: true},
			{Source: d.chans.dir(sb.ID), Target: agentapi.SocketDir, ReadOnly: true},
		}, d.net.Mounts(sb)...),
		Resources: runtime.Resources{
			CPUMillis:   sb.Resources.CPUMillis,
			MemoryBytes: sb.Resources.MemoryMiB << 20,
			Pids:        sb.Resources.Pids,
		},
		NetNSPath: d.net.NetNSPath(sb),
		UserNS:    d.userns.forRuntime(sb),
		// The runtime's log is in the bundle dir, which the sandbox never sees.
		LogPath: filepath.Join(d.SandboxDir(sb.ID), "runtime.log"),
	}
}

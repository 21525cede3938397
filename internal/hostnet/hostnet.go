// Package hostnet is the host side of sandbox networking: it attaches
// sandboxes to the bridge (network namespaces, reattachment after a
// restart), holds their egress policies, seals and grants secrets, and
// exposes sandbox ports. It owns the egress proxy, berth's CA and the egress
// log buffer (netState, under its own mutex). It reaches the lifecycle core
// only through Core.
//
// Locks: a sandbox's lifecycle lock (Core.Lock) may be held when
// netState.mu is taken (Up and Down run inside lifecycle operations); mu is
// never held while calling into the core, the store or the proxy.
package hostnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/network"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/safefs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// Core is what the service needs of the lifecycle core (*daemon.Daemon).
type Core interface {
	Store() store.Store
	// Lock serialises lifecycle operations on one sandbox.
	Lock(id string) func()
	// Visible loads a sandbox as owner may see it ("" = admin).
	Visible(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Event(ctx context.Context, sb *sandbox.Sandbox, actor, typ, reason, msg string, data map[string]string)
	GoBackground(name string, fn func(ctx context.Context))
	SandboxDir(id string) string
	Log() *slog.Logger
	Now() time.Time
}

// Authenticator maps an API key to its principal (the auth service).
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (auth.Principal, error)
}

// EgressFeed receives, once a second, the outbound connections each
// attached sandbox has open (the reaper's egress signal).
type EgressFeed interface {
	NoteEgress(id string, inflight int)
}

// Service is sandbox networking on this host.
type Service struct {
	core    Core
	authn   Authenticator
	feed    EgressFeed
	dataDir string
	auditor Auditor       // egress verdicts (audit.go); nil: none
	ledger  egress.Ledger // side effects (SetLedger); nil: none
	leases  LeaseSource   // nil: grants are the sandbox's secret refs as they are

	// secretsChanged counts secret writes and deletes: grants opened ahead
	// (PrepareLeaseGrants) are opened again if it moved.
	secretsChanged atomic.Uint64

	// net is set once by Start, before any sandbox is reconciled or
	// served, and never changes after; nil: networking is disabled.
	net *netState
}

// New builds the service; networking stays disabled until Start.
func New(core Core, dataDir string, authn Authenticator, feed EgressFeed) *Service {
	return &Service{core: core, authn: authn, feed: feed, dataDir: dataDir}
}

// Enabled reports whether Start set up networking.
func (h *Service) Enabled() bool { return h.net != nil }

// Options configures sandbox networking (Start). Without
// Start every sandbox gets an empty network namespace: deny-all is
// the only policy such a server can honour.
type Options struct {
	// Network is the bridge/subnet/nftables layout; StateDir defaults to
	// DATA_DIR/network. Egress is filled in by Start.
	Network network.Config
	// UpstreamCA is a PEM bundle the proxy trusts for upstream TLS besides
	// the host's trust store (berth serve --upstream-ca).
	UpstreamCA string
	// HostsFile is read by the egress resolver before the host's resolver
	// (default /etc/hosts).
	HostsFile string
	// DefaultMode is the policy of sandboxes created without one: deny-all
	// (default) or allow-all.
	DefaultMode egress.Mode
	// AllowPrivate are the private/link-local ranges sandboxes may reach
	// (berth serve --allow-private-egress); no tenant rule opens others.
	AllowPrivate []netip.Prefix
	// UpstreamDNS is the resolver the egress proxy asks instead of the
	// host's (berth serve --egress-resolver); unset = /etc/resolv.conf.
	UpstreamDNS netip.AddrPort
	// Limits are the per-sandbox egress caps; zero fields take defaults.
	Limits egress.Limits
}

// Paths inside a sandbox where berth's egress CA is installed.
const (
	caInSandbox     = "/usr/local/share/ca-certificates/berth-egress.crt"
	caBundleInRoot  = "etc/ssl/certs/ca-certificates.crt"
	resolvInSandbox = "/etc/resolv.conf"
)

// SnapshotPolicyKey is the key of a snapshot's Extra holding the network
// policy (egress.MarshalPolicy JSON) of the sandbox it was taken from.
const SnapshotPolicyKey = "network_policy"

// netState is the host's network: namespaces, the egress proxy, berth's
// CA and the sealer of secrets.
type netState struct {
	mgr    *network.Manager
	px     *egress.Proxy
	ca     *egress.CA
	sealer *egress.Sealer
	def    egress.Mode

	mu      sync.Mutex
	owners  map[string]string // sandbox id → owner, for log entries
	pending []store.EgressEntry
	dropped int
}

const maxPendingEgress = 20000

// Release removes the bridge and ruleset at shutdown when no sandbox
// still has a network namespace on it (running, or frozen). Otherwise they
// stay: sandboxes outlive the daemon, and the next start adopts them.
func (h *Service) Release() {
	if h.net == nil || h.net.mgr == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	live, _, err := h.core.Store().ListSandboxes(ctx, store.SandboxFilter{States: []sandbox.State{
		sandbox.Creating, sandbox.Running, sandbox.Pausing, sandbox.Resuming, sandbox.Paused}})
	if err != nil {
		return
	}
	for _, sb := range live {
		if sb.State != sandbox.Paused || sb.PauseActual == sandbox.PauseFreeze {
			return
		}
	}
	if err := h.net.mgr.Teardown(ctx); err != nil {
		h.core.Log().Warn("network teardown at shutdown", "err", err)
	}
}

// Start sets up the bridge and ruleset, starts the egress proxy under
// supervision and the egress log writer. Call it before Reconcile.
func (h *Service) Start(ctx context.Context, o Options) error {
	switch o.DefaultMode {
	case "":
		o.DefaultMode = egress.DenyAll
	case egress.DenyAll, egress.AllowAll:
	default:
		return errs.Field("default_network", "must be deny-all or allow-all, got %q", o.DefaultMode)
	}
	if o.Network.StateDir == "" {
		o.Network.StateDir = filepath.Join(h.dataDir, "network")
	}
	egressDir := filepath.Join(h.dataDir, "egress")
	ca, err := egress.LoadOrCreateCA(egressDir)
	if err != nil {
		return err
	}
	sealer, err := egress.LoadOrCreateSealer(egressDir)
	if err != nil {
		return err
	}
	if err := auth.PrivateFiles(egressDir, "ca-key.pem", "secrets.key"); err != nil {
		return err
	}
	ns := &netState{ca: ca, sealer: sealer, def: o.DefaultMode, owners: map[string]string{}}
	ncfg := o.Network
	ncfg.Log = h.core.Log()
	// The subnet must be final before the proxy is built (it is blocked there).
	if !ncfg.Subnet.IsValid() {
		ncfg.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	eff := ncfg
	px, err := egress.New(egress.Config{
		ProxyAddr: eff.ProxyAddr(), DNSAddr: eff.DNSAddr(), CA: ca, ExtraCAFile: o.UpstreamCA,
		HostsFile: o.HostsFile, Blocked: []netip.Prefix{eff.Subnet}, Sink: h.auditSink(ns.sink), Log: h.core.Log(),
		AllowPrivate: o.AllowPrivate, UpstreamDNS: o.UpstreamDNS,
		MaxConns: o.Limits.MaxConns, MaxDNSInFlight: o.Limits.MaxDNSInFlight, DNSQPS: o.Limits.DNSQPS,
		OnLimit: h.egressLimitHit,
	})
	if err != nil {
		return err
	}
	ncfg.Egress = px
	mgr, err := network.New(ncfg)
	if err != nil {
		return err
	}
	if err := mgr.Setup(ctx); err != nil {
		return err
	}
	ns.mgr, ns.px = mgr, px
	if h.ledger != nil {
		px.SetLedger(h.ledger)
	}
	h.net = ns
	h.core.GoBackground("egress-proxy", h.superviseProxy)
	h.core.GoBackground("egress-log", h.egressLogLoop)
	h.core.GoBackground("egress-inflight", h.feedEgress)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := px.WaitReady(rctx); err != nil {
		h.core.Log().Error("egress proxy not ready; sandboxes have no egress until it is", "err", err)
	}
	h.core.Log().Info("network ready", "bridge", mgr.Config().BridgeName, "subnet", eff.Subnet.String(), "proxy", eff.ProxyAddr().String(),
		"default_network", string(o.DefaultMode))
	return nil
}

// superviseProxy keeps the egress proxy running. While it is down the
// nftables rules still steer sandbox traffic to its port, where nothing
// listens: connections are refused (fail closed).
func (h *Service) superviseProxy(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := runProxy(ctx, h.net.px)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 30*time.Second {
			backoff = 100 * time.Millisecond
		}
		h.core.Log().Error("egress proxy stopped; restarting", "err", err, "backoff", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// runProxy runs px until it returns, turning a panic into an error so the
// supervisor restarts it.
func runProxy(ctx context.Context, px *egress.Proxy) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("egress proxy panicked: %v", r)
		}
	}()
	if err := px.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("egress proxy returned")
	}
	return nil
}

// egressLimitHit records that a sandbox hit a per-sandbox egress cap as an
// event (the proxy calls it at most every egress.LimitReportEvery per
// sandbox and cap); it must not block the proxy.
func (h *Service) egressLimitHit(id, limit string, max int) {
	h.core.GoBackground("egress-limit-event", func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		sb, err := h.core.Store().GetSandbox(ctx, id)
		if err != nil {
			return
		}
		h.core.Event(ctx, sb, "egress", "network", "egress_limit",
			fmt.Sprintf("egress cap reached: %s (max %d); further attempts are refused", limit, max),
			map[string]string{"limit": limit, "max": fmt.Sprint(max)})
	})
}

// sink receives the proxy's decisions; it never blocks.
func (n *netState) sink(dec egress.Decision) {
	e := store.EgressEntry{SandboxID: dec.SandboxID, Time: dec.Time, Proto: dec.Proto, DstPort: int(dec.DstPort),
		Host: dec.Host, Rule: dec.Rule, Verdict: dec.Verdict, Reason: dec.Reason, Intercepted: dec.Intercepted,
		BytesOut: dec.BytesOut, BytesIn: dec.BytesIn, Duration: dec.Duration}
	if dec.DstIP.IsValid() {
		e.DstIP = dec.DstIP.String()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e.Owner = n.owners[dec.SandboxID]
	if len(n.pending) >= maxPendingEgress {
		n.dropped++
		return
	}
	n.pending = append(n.pending, e)
}

func (h *Service) egressLogLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			h.flushEgress(fctx)
			cancel()
			return
		case <-t.C:
			h.flushEgress(ctx)
		}
	}
}

// flushEgress writes pending decisions to the store.
func (h *Service) flushEgress(ctx context.Context) {
	n := h.net
	n.mu.Lock()
	batch, dropped := n.pending, n.dropped
	n.pending, n.dropped = nil, 0
	n.mu.Unlock()
	if dropped > 0 {
		h.core.Log().Warn("egress log overflow: decisions dropped", "count", dropped)
	}
	if len(batch) == 0 {
		return
	}
	if err := h.core.Store().AppendEgress(ctx, batch); err != nil {
		h.core.Log().Error("persist egress log", "err", err, "entries", len(batch))
	}
}

// feedEgress tells the reaper, once a second, how many outbound
// connections each attached sandbox has open (NoteEgress).
func (h *Service) feedEgress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.net.mu.Lock()
		ids := make([]string, 0, len(h.net.owners))
		for id := range h.net.owners {
			ids = append(ids, id)
		}
		h.net.mu.Unlock()
		for _, id := range ids {
			if _, ok := h.net.mgr.Get(id); ok {
				h.feed.NoteEgress(id, h.net.px.InFlight(id))
			} else {
				h.feed.NoteEgress(id, 0)
			}
		}
	}
}

// NetNSPath is the network namespace a sandbox's spec joins: its attachment,
// or none (the runtime then gives it an empty namespace).
func (h *Service) NetNSPath(sb *sandbox.Sandbox) string {
	if h.net != nil {
		if att, ok := h.net.mgr.Get(sb.ID); ok {
			return att.NetNSPath
		}
	}
	return sb.Net.NetnsPath
}

func (h *Service) netDir(id string) string { return filepath.Join(h.core.SandboxDir(id), "net") }

// Mounts are the read-only files the network puts into an attached
// sandbox: its resolv.conf and berth's egress CA.
func (h *Service) Mounts(sb *sandbox.Sandbox) []runtime.Mount {
	if h.net == nil {
		return nil
	}
	if _, ok := h.net.mgr.Get(sb.ID); !ok {
		return nil
	}
	return h.fileMounts(sb.ID)
}

func (h *Service) fileMounts(id string) []runtime.Mount {
	dir := h.netDir(id)
	return []runtime.Mount{
		{Source: filepath.Join(dir, "resolv.conf"), Target: resolvInSandbox, ReadOnly: true},
		{Source: filepath.Join(dir, "berth-egress.crt"), Target: caInSandbox, ReadOnly: true},
	}
}

// Up attaches a sandbox to the network with its stored policy (or keeps
// an attachment that survived a memory pause), registers its credential
// grants and prepares the files Mounts mounts. root is the sandbox's
// mounted root filesystem.
func (h *Service) Up(ctx context.Context, sb *sandbox.Sandbox, root string) error {
	pol, err := policyOf(sb)
	if err != nil {
		return err
	}
	if h.net == nil {
		if pol.Mode != egress.DenyAll {
			return errs.E(errs.FailedPrecondition, "sandbox %s has network policy %s, but networking is disabled on this server", sb.ID, pol.Mode)
		}
		return nil
	}
	n := h.net
	n.mu.Lock()
	n.owners[sb.ID] = sb.Owner
	n.mu.Unlock()
	att, ok := n.mgr.Get(sb.ID)
	if ok {
		if err := n.mgr.UpdatePolicy(ctx, sb.ID, pol); err != nil {
			return err
		}
	} else if att, err = n.mgr.Attach(ctx, sb.ID, pol); err != nil {
		return err
	}
	if err := h.applyGrants(ctx, sb); err != nil {
		return err
	}
	if err := h.writeFiles(sb.ID, att.ResolvConf); err != nil {
		return err
	}
	if root != "" {
		h.Trust(sb, root)
	}
	return nil
}

// writeFiles writes the files Mounts mounts into sandbox id.
func (h *Service) writeFiles(id, resolvConf string) error {
	dir := h.netDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(resolvConf), 0o644); err != nil {
		return errs.Wrap(errs.Internal, err, "write resolv.conf")
	}
	if err := os.WriteFile(filepath.Join(dir, "berth-egress.crt"), h.net.ca.PEM(), 0o644); err != nil {
		return errs.Wrap(errs.Internal, err, "write egress CA")
	}
	return nil
}

// Starting is an Up in two halves, for a runtime that joins the sandbox's
// network namespace by its path and reads nothing of it when it starts
// (runc): Begin takes the address and makes the namespace and the files,
// the runtime starts the sandbox in that namespace (which has only a
// loopback device, down), and Finish, beside the start, adds the veth, the
// addresses, the ruleset and the grants. That takes the veth and the
// ruleset (3 of a cold create's ~4.5 ms of network on the reference host)
// off the create's path. Nothing but berth's agent runs in the sandbox
// before the create answers, and the create answers only after Finish.
type Starting struct {
	h        *Service
	sb       *sandbox.Sandbox
	p        *network.Pending
	attached bool // Finish attached it: undone by Down
}

// Begin is the first half of Up (see Starting). A sandbox already attached
// (a memory pause or a rewind kept it), or a server without networking,
// gets all of Up at once: then Begin answers a nil Starting, and the caller
// undoes it with Down as it would an Up.
func (h *Service) Begin(ctx context.Context, sb *sandbox.Sandbox) (*Starting, error) {
	if h.net == nil {
		return nil, h.Up(ctx, sb, "")
	}
	if _, ok := h.net.mgr.Get(sb.ID); ok {
		return nil, h.Up(ctx, sb, "")
	}
	pol, err := policyOf(sb)
	if err != nil {
		return nil, err
	}
	n := h.net
	n.mu.Lock()
	n.owners[sb.ID] = sb.Owner
	n.mu.Unlock()
	p, err := n.mgr.Begin(ctx, sb.ID, pol)
	if err != nil {
		h.forgetOwner(sb.ID)
		return nil, err
	}
	st := &Starting{h: h, sb: sb, p: p}
	if err := h.writeFiles(sb.ID, p.ResolvConf()); err != nil {
		return nil, errors.Join(err, st.Undo(ctx))
	}
	return st, nil
}

// forgetOwner drops id from the attached sandboxes' owners.
func (h *Service) forgetOwner(id string) {
	h.net.mu.Lock()
	delete(h.net.owners, id)
	h.net.mu.Unlock()
}

// NetNSPath is the namespace the sandbox's spec joins.
func (st *Starting) NetNSPath() string { return st.p.NetNSPath() }

// Mounts are the files the sandbox's spec mounts, which Service.Mounts
// does not know of until Finish.
func (st *Starting) Mounts() []runtime.Mount { return st.h.fileMounts(st.sb.ID) }

// Finish is the second half of Up. On error the attachment is gone, or
// left for Undo to remove.
func (st *Starting) Finish(ctx context.Context) error {
	if _, err := st.p.Finish(ctx); err != nil {
		return err
	}
	st.attached = true
	return st.h.applyGrants(ctx, st.sb)
}

// Undo removes what Begin and Finish made: Down once attached, else
// Begin's half.
func (st *Starting) Undo(ctx context.Context) error {
	if st.attached {
		return st.h.Down(ctx, st.sb)
	}
	st.h.forgetOwner(st.sb.ID)
	return st.p.Abort(ctx)
}

// Trust adds berth's egress CA to the trust bundle in the sandbox's
// mounted root filesystem (the part of Up that needs the filesystem).
func (h *Service) Trust(sb *sandbox.Sandbox, root string) {
	if h.net == nil || h.net.ca == nil {
		return
	}
	if err := appendCA(root, caBundleInRoot, h.net.ca.PEM()); err != nil {
		h.core.Log().Warn("could not add the egress CA to the sandbox's trust bundle", "sandbox_id", sb.ID, "err", err)
	}
}

// Down detaches a sandbox from the network (stop, disk pause, delete).
func (h *Service) Down(ctx context.Context, sb *sandbox.Sandbox) error {
	if h.net == nil {
		return nil
	}
	h.net.mu.Lock()
	delete(h.net.owners, sb.ID)
	h.net.mu.Unlock()
	h.feed.NoteEgress(sb.ID, 0)
	return h.net.mgr.Detach(ctx, sb.ID)
}

// Refresh keeps a halted sandbox's attachment for the start that follows
// at once (a rewind or promote), as network.Manager.Refresh says: its
// old processes' proxied connections end, and its namespace is set up
// again as an attach leaves it. Up then keeps it and applies the stored
// policy. Nothing to do without networking or an attachment.
func (h *Service) Refresh(ctx context.Context, sb *sandbox.Sandbox) error {
	if h.net == nil {
		return nil
	}
	if _, ok := h.net.mgr.Get(sb.ID); !ok {
		return nil
	}
	h.feed.NoteEgress(sb.ID, 0)
	return h.net.mgr.Refresh(ctx, sb.ID)
}

// appendCA adds pem to the trust bundle at rel inside root if the bundle
// exists and lacks it. The workspace is the sandbox's to change, so the path
// is resolved beneath root with no symlinks and must name a regular file
// (safefs): a planted symlink, FIFO or device node is refused, never followed.
func appendCA(root, rel string, pem []byte) error {
	f, err := safefs.OpenFile(root, rel, os.O_RDWR, 0)
	if errs.Is(err, errs.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() > 16<<20 {
		return errors.Join(err, errors.New("not a trust bundle of sane size"))
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return err
	}
	if strings.Contains(string(b), strings.TrimSpace(string(pem))) {
		return nil
	}
	add := pem
	if len(b) > 0 && b[len(b)-1] != '\n' {
		add = append([]byte("\n"), pem...)
	}
	_, err = f.WriteAt(add, st.Size())
	return err
}

// Reconcile runs after Reconcile settled every sandbox: attachments
// of sandboxes that no longer run are removed, and the policies and grants
// of those that do are registered again (grants live in memory only).
func (h *Service) Reconcile(ctx context.Context) error {
	if h.net == nil {
		return nil
	}
	all, _, err := h.core.Store().ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return err
	}
	var live []string
	var keep, active []*sandbox.Sandbox
	for _, sb := range all {
		switch sb.State {
		case sandbox.Stopped, sandbox.Failed, sandbox.Deleted:
			continue
		}
		active = append(active, sb)
		if _, ok := h.net.mgr.Get(sb.ID); ok {
			live = append(live, sb.ID)
			keep = append(keep, sb)
		}
	}
	errList := []error{h.net.mgr.Reconcile(ctx, live)}
	h.reportReattached(ctx, active)
	for _, sb := range keep {
		if err := h.Up(ctx, sb, ""); err != nil {
			errList = append(errList, fmt.Errorf("sandbox %s: %w", sb.ID, err))
		}
	}
	return errors.Join(errList...)
}

// reportReattached records what network Setup did to sandboxes whose
// attachment did not fit the layout of this start: each one is an event, so
// a changed address (or a lost network) is never silent.
func (h *Service) reportReattached(ctx context.Context, all []*sandbox.Sandbox) {
	moved, lost := h.net.mgr.Reattached()
	for _, sb := range all {
		if m, ok := moved[sb.ID]; ok {
			if sb.Runtime == "runsc" {
				// gVisor's netstack copied the namespace's interfaces when the
				// sandbox booted; it does not see the new veth.
				h.core.Event(ctx, sb, "berth", "network", "network_lost",
					"the network layout changed across a daemon restart ("+m+"); gVisor configured the sandbox's network at boot, so it has none until it is restarted (stop, start)", nil)
				continue
			}
			h.core.Event(ctx, sb, "berth", "network", "network_reattached",
				"the network layout changed across a daemon restart; the sandbox got a new address "+m, nil)
		}
		if why, ok := lost[sb.ID]; ok {
			h.core.Event(ctx, sb, "berth", "network", "network_lost",
				"the sandbox could not be reattached to the network layout of this start and has no network until it is restarted (stop, start): "+why, nil)
		}
	}
}

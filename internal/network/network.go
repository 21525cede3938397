// Package network gives every sandbox its own network namespace on a host
// bridge owned by berth, with an address, a default route, NAT and an
// nftables ruleset that steers all of its traffic through the egress proxy
// and resolver (internal/egress). Plans are pure (Plan, the whole ruleset);
// the effects are small wrappers around netlink (links, addresses, routes,
// set in-process; apply_linux.go), `nft` for the whole ruleset, and one
// netlink batch per group of per-sandbox deltas whose cost does not grow
// with the number of sandboxes (loads.go, nl_linux.go).
package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/phases"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/undo"
)

// Policy, Rule and friends live in internal/egress (which enforces them);
// these aliases let callers speak of network.Policy.
type (
	Policy = egress.Policy
	Rule   = egress.Rule
)

// Policy modes.
const (
	DenyAll  = egress.DenyAll
	AllowAll = egress.AllowAll
	Rules    = egress.Rules
)

// ParseRule reads "CIDR|IP|host|*.domain[:PORT]"; see egress.ParseRule.
func ParseRule(s string) (Rule, error) { return egress.ParseRule(s) }

// Config configures a Manager. Zero values get the defaults noted.
type Config struct {
	BridgeName string       // default "berth0"
	Subnet     netip.Prefix // default 10.88.0.0/16; the gateway is its first address
	StateDir   string       // required: netns bind mounts and network.json live here
	Table      string       // nftables table name (inet and bridge), default "berth"
	VethPrefix string       // host-side veth names start with it, default "bv"
	ProxyPort  uint16       // egress proxy port on the gateway, default 15001
	DNSPort    uint16       // resolver port on the gateway, default 53
	// Egress enforces the userspace half of every policy; required for
	// Attach (build it with egress.Config{ProxyAddr: cfg.ProxyAddr(), DNSAddr: cfg.DNSAddr()}).
	Egress *egress.Proxy
	Log    *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.BridgeName == "" {
		c.BridgeName = "berth0"
	}
	if !c.Subnet.IsValid() {
		c.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	c.Subnet = c.Subnet.Masked()
	if c.Table == "" {
		c.Table = "berth"
	}
	if c.VethPrefix == "" {
		c.VethPrefix = "bv"
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = 15001
	}
	if c.DNSPort == 0 {
		c.DNSPort = 53
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Gateway is the bridge's address: the sandboxes' default route and resolver.
func (c Config) Gateway() netip.Addr { return c.withDefaults().Subnet.Addr().Next() }

// ProxyAddr is where the egress proxy must listen.
func (c Config) ProxyAddr() netip.AddrPort {
	return netip.AddrPortFrom(c.Gateway(), c.withDefaults().ProxyPort)
}

// DNSAddr is where the egress resolver must listen.
func (c Config) DNSAddr() netip.AddrPort {
	return netip.AddrPortFrom(c.Gateway(), c.withDefaults().DNSPort)
}

// Attachment is what the daemon needs to start a sandbox in its namespace.
type Attachment struct {
	NetNSPath  string     // runtime.Spec.NetNSPath
	IP         netip.Addr // the sandbox's address
	Gateway    netip.Addr
	DNS        netip.Addr
	ResolvConf string // contents for the sandbox's /etc/resolv.conf
}

// Manager owns the bridge, the nftables tables and every sandbox's namespace.
// It is safe for concurrent use; changes are serialised.
type Manager struct {
	cfg  Config
	plan PlanConfig
	log  *slog.Logger

	mu  sync.Mutex
	sbs map[string]*record
	// recent is the address each detached sandbox last had: a sandbox
	// attached again (a runsc rewind or promote halts and re-attaches) gets
	// it back, and a new sandbox takes it only when no other address is
	// free, so neither the sandbox nor its neighbours' caches see it change.
	// An entry goes when its address is handed to another sandbox: at most
	// one per free address.
	recent map[string]netip.Addr
	// unlinking are the detached sandboxes whose veth and namespace are
	// being removed outside mu (Detach).
	unlinking map[string]*unlinking
	moved     map[string]string // Reattached
	lost      map[string]string
	gen       uint64 // changes of sbs that a ruleset load must render (loads.go)
	// pending are the ruleset deltas of the changes no load has taken yet.
	pending []delta

	nftMu sync.Mutex // one ruleset load at a time, in order (loads.go)
	// stale: the kernel may not hold the ruleset the last load rendered
	// (nothing loaded yet, or a load failed); the next load is a whole one.
	// Guarded by nftMu.
	stale bool
	loads *loads
}

// record is one attached sandbox, persisted in StateDir/network.json.
type record struct {
	IP     netip.Addr    `json:"ip"`
	Veth   string        `json:"veth"`
	Policy egress.Policy `json:"policy"`
	// attaching: Attach is making its namespace and veth. It holds its
	// address (and is saved, for Reconcile), but no whole ruleset renders
	// it and Get does not see it: its attach delta, queued once it is
	// made, adds it to the ruleset.
	attaching bool
}

// New validates cfg and loads the persisted attachments (they are
// re-applied by Setup and pruned by Reconcile).
func New(cfg Config) (*Manager, error) {
	cfg = cfg.withDefaults()
	if cfg.StateDir == "" {
		return nil, errs.Field("network.state_dir", "must be set")
	}
	if cfg.Subnet.Bits() > 30 {
		return nil, errs.Field("network.subnet", "%s is too small; want /30 or larger", cfg.Subnet)
	}
	plan := PlanConfig{Table: cfg.Table, Bridge: cfg.BridgeName, VethPrefix: cfg.VethPrefix,
		Subnet: cfg.Subnet, Gateway: cfg.Gateway(), ProxyPort: cfg.ProxyPort, DNSPort: cfg.DNSPort}
	if cfg.Egress != nil {
		plan.OpenPrivate = cfg.Egress.OpenPrivate()
	}
	if err := checkPlanConfig(plan); err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, err, "network config")
	}
	m := &Manager{cfg: cfg, plan: plan, log: cfg.Log, sbs: map[string]*record{}, recent: map[string]netip.Addr{}, unlinking: map[string]*unlinking{}, moved: map[string]string{}, lost: map[string]string{}, loads: newLoads(), stale: true}
	b, err := os.ReadFile(m.statePath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, errs.Wrap(errs.Internal, err, "read network state")
	default:
		if err := json.Unmarshal(b, &m.sbs); err != nil {
			return nil, errs.Wrap(errs.FailedPrecondition, err, "parse %s", m.statePath())
		}
	}
	return m, nil
}

// Config returns the effective configuration (defaults applied).
func (m *Manager) Config() Config { return m.cfg }

// Setup creates the bridge, enables forwarding and installs the ruleset
// (including every persisted sandbox). Persisted sandboxes that do not fit
// the configured layout (another subnet, bridge or veth prefix than the
// one they were attached with) are reattached (see Reattached). The layout
// is saved for SavedLayout. Idempotent.
func (m *Manager) Setup(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := os.MkdirAll(m.netnsDir(), 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create %s", m.netnsDir())
	}
	if err := setupBridge(ctx, m.cfg.BridgeName, netip.PrefixFrom(m.cfg.Gateway(), m.cfg.Subnet.Bits())); err != nil {
		return err
	}
	prev, hadPrev, _ := SavedLayout(m.cfg.StateDir)
	if err := m.saveLayout(); err != nil {
		return err
	}
	if err := m.reconcileLayoutLocked(ctx); err != nil {
		return err
	}
	if err := m.loadLocked(ctx, true); err != nil {
		return err
	}
	if hadPrev {
		m.dropPrevLayout(ctx, prev)
	}
	if m.cfg.Egress != nil {
		for id, r := range m.sbs {
			if err := m.cfg.Egress.SetSandbox(id, r.IP, r.Policy); err != nil {
				return err
			}
		}
	}
	return nil
}

// Attach creates the sandbox's namespace, veth, address, route and rules.
// On error nothing is left behind.
func (m *Manager) Attach(ctx context.Context, id string, pol Policy) (Attachment, error) {
	p, err := m.Begin(ctx, id, pol)
	if err != nil {
		return Attachment{}, err
	}
	return p.Finish(ctx)
}

// Pending is an attachment begun: its address is taken (intent first:
// after a crash, Reconcile finds and removes what follows) and its network
// namespace exists, with nothing in it but a loopback device that is down,
// so whatever runs there reaches nothing. A runtime that joins the
// namespace by its path and reads nothing of it at start (runc) can start
// the sandbox while Finish adds the veth, the addresses and the ruleset.
// The caller ends it with exactly one Finish or Abort.
type Pending struct {
	m       *Manager
	id      string
	pol     Policy
	r       *record
	ph      *phases.Timer
	cleanup undo.Stack
}

// NetNSPath is the path of the pending attachment's namespace.
func (p *Pending) NetNSPath() string { return p.m.netnsPath(p.id) }

// ResolvConf is what the sandbox's /etc/resolv.conf will hold.
func (p *Pending) ResolvConf() string { return p.m.resolvConf() }

// Begin takes id's address and makes its namespace: the first part of
// Attach. The address and the record are taken under m.mu; the namespace
// is made outside it (as Finish makes the veth and addresses), where only
// this sandbox's boot, which waits for the attach, could see it.
func (m *Manager) Begin(ctx context.Context, id string, pol Policy) (p *Pending, err error) {
	if !sandbox.ValidID(id) {
		return nil, errs.Field("sandbox_id", "%q is not a sandbox id", id)
	}
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	if m.cfg.Egress == nil {
		return nil, errs.E(errs.FailedPrecondition, "network: no egress proxy configured")
	}
	ph := phases.Start("network attach")
	p = &Pending{m: m, id: id, pol: pol, ph: ph}
	defer func() {
		if err != nil {
			ph.Log(ctx, m.log, id, err)
		}
	}()
	m.mu.Lock()
	p.r, err = m.reserveLocked(ctx, id, pol)
	m.mu.Unlock()
	p.ph.Mark("reserve")
	if err != nil {
		return nil, err
	}
	p.cleanup.Push(func(context.Context) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.sbs, id)
		return m.saveLocked()
	})
	nsPath := m.netnsPath(id)
	err = createNetns(ctx, nsPath)
	p.ph.Mark("netns")
	if err != nil {
		return nil, errors.Join(err, p.Abort(ctx))
	}
	p.cleanup.Push(func(context.Context) error { return deleteNetns(nsPath) })
	return p, nil
}

// Abort removes what Begin made.
func (p *Pending) Abort(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return p.cleanup.Run(ctx)
}

// Finish makes the veth, configures the namespace, registers the sandbox
// with the proxy and loads its part of the ruleset, with the changes of the
// attaches and detaches beside it (loads.go). On error nothing of the
// attachment is left, Begin's part included.
func (p *Pending) Finish(ctx context.Context) (Attachment, error) {
	att, gen, err := p.link(ctx)
	m, id := p.m, p.id
	if err != nil {
		p.ph.Log(ctx, m.log, id, err)
		return Attachment{}, err
	}
	err = m.sync(ctx, gen)
	p.ph.Mark("ruleset")
	p.ph.Log(ctx, m.log, id, err)
	if err != nil {
		m.mu.Lock()
		derr := m.detachLocked(ctx, id)
		dgen := m.gen
		m.mu.Unlock()
		return Attachment{}, errors.Join(err, derr, m.sync(ctx, dgen))
	}
	m.log.Info("network attached", "sandbox_id", id, "ip", att.IP.String(), "mode", string(p.pol.Mode))
	return att, nil
}

// link is Finish up to the ruleset load; gen is the change that load must
// render. On error it unwinds Begin's part too.
func (p *Pending) link(ctx context.Context) (att Attachment, gen uint64, err error) {
	m, id, r := p.m, p.id, p.r
	defer p.cleanup.Unwind(ctx, 30*time.Second, &err)
	nsPath := m.netnsPath(id)
	err = createVeth(ctx, r.Veth, nsPath, m.cfg.BridgeName)
	p.ph.Mark("veth")
	if err != nil {
		return Attachment{}, 0, err
	}
	p.cleanup.Push(func(ctx context.Context) error { return deleteLink(ctx, r.Veth) })
	err = configureInside(ctx, nsPath, netip.PrefixFrom(r.IP, m.cfg.Subnet.Bits()), m.cfg.Gateway())
	p.ph.Mark("inside")
	if err != nil {
		return Attachment{}, 0, err
	}
	if err = forgetNeighbour(m.cfg.BridgeName, r.IP); err != nil {
		return Attachment{}, 0, err
	}
	err = m.cfg.Egress.SetSandbox(id, r.IP, p.pol)
	p.ph.Mark("neighbour_egress")
	if err != nil {
		return Attachment{}, 0, err
	}
	p.cleanup.Push(func(context.Context) error { m.cfg.Egress.RemoveSandbox(id); return nil })
	outsideLock("attaching", id)
	m.mu.Lock()
	defer m.mu.Unlock()
	r.attaching = false
	p.cleanup.Release() // from here on a failure is a detach (Finish)
	return m.attachmentLocked(id, r), m.changedLocked(delta{opAttach, sandboxNet(id, r)}), nil
}

// reserveLocked records id's attachment with a free address and saves the
// state, after any removal of id's previous veth and namespace is done.
func (m *Manager) reserveLocked(ctx context.Context, id string, pol Policy) (*record, error) {
	if err := m.waitUnlinkedLocked(ctx, id); err != nil {
		return nil, err
	}
	if _, ok := m.sbs[id]; ok {
		return nil, errs.E(errs.AlreadyExists, "sandbox %s already has a network", id)
	}
	ip, err := m.allocLocked(id)
	if err != nil {
		return nil, err
	}
	r := &record{IP: ip, Veth: m.vethName(id), Policy: pol, attaching: true}
	if err := checkSandboxNet(m.plan, sandboxNet(id, r)); err != nil {
		return nil, err
	}
	m.sbs[id] = r
	if err := m.saveLocked(); err != nil {
		delete(m.sbs, id)
		return nil, err
	}
	return r, nil
}

// Get returns the attachment of a sandbox.
func (m *Manager) Get(id string) (Attachment, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbs[id]
	if !ok || r.attaching {
		return Attachment{}, false
	}
	return m.attachmentLocked(id, r), true
}

func (m *Manager) attachmentLocked(id string, r *record) Attachment {
	gw := m.cfg.Gateway()
	return Attachment{NetNSPath: m.netnsPath(id), IP: r.IP, Gateway: gw, DNS: gw, ResolvConf: m.resolvConf()}
}

// resolvConf is every sandbox's /etc/resolv.conf: the gateway's DNS.
func (m *Manager) resolvConf() string {
	return "nameserver " + m.cfg.Gateway().String() + "\noptions edns0\n"
}

// UpdatePolicy replaces a running sandbox's policy. The nftables part is one
// transaction and the proxy part one atomic swap; they govern disjoint
// traffic (forwarded UDP/ICMP vs. proxied TCP and DNS answers), so no packet
// or connection is ever judged by anything but the old or the new policy.
// Connections the new policy denies are closed.
func (m *Manager) UpdatePolicy(ctx context.Context, id string, pol Policy) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbs[id]
	if !ok {
		return errs.E(errs.NotFound, "sandbox %s has no network", id)
	}
	old := r.Policy
	if reflect.DeepEqual(old, pol) {
		// Unchanged (every running sandbox at a daemon start): the ruleset
		// renders it already, and a load plus a state write per sandbox made
		// a restart over N sandboxes O(N²). The new proxy still needs it.
		return m.cfg.Egress.SetSandbox(id, r.IP, pol)
	}
	r.Policy = pol
	m.changedLocked(delta{opUpdate, sandboxNet(id, r)})
	if err := m.loadLocked(ctx, false); err != nil {
		// The load failed as a whole: the kernel still has the old policy.
		r.Policy = old
		return err
	}
	if err := m.cfg.Egress.SetSandbox(id, r.IP, pol); err != nil {
		return err
	}
	m.log.Info("network policy updated", "sandbox_id", id, "mode", string(pol.Mode))
	return m.saveLocked()
}

// Refresh readies a kept attachment for a new start of its sandbox in the
// same namespace, once every process of the old start is gone: the egress
// proxy forgets the old processes' connections and per-sandbox state (the
// next UpdatePolicy or SetSandbox starts it afresh, as Attach does), and
// eth0 is configured again as Attach left it. runsc (network=sandbox)
// moves eth0's addresses and routes into its own netstack when it
// starts, so a start in the kept namespace would come up with none.
// The namespace, veth, address and ruleset stay: no other sandbox can
// take the address meanwhile, and no nftables load is needed.
func (m *Manager) Refresh(ctx context.Context, id string) error {
	m.mu.Lock()
	r, ok := m.sbs[id]
	var ip netip.Addr
	if ok {
		ip = r.IP
	}
	m.mu.Unlock()
	if !ok {
		return errs.E(errs.NotFound, "sandbox %s has no network", id)
	}
	if m.cfg.Egress != nil {
		m.cfg.Egress.RemoveSandbox(id)
	}
	return reconfigureInside(ctx, m.netnsPath(id), netip.PrefixFrom(ip, m.cfg.Subnet.Bits()), m.cfg.Gateway())
}

// Detach removes everything Attach created. Detaching an unknown sandbox is
// not an error. The veth and the namespace are removed outside m.mu: their
// removal waits on the kernel (10-15 ms on the reference host, most of a
// detach), and other sandboxes' attaches and lookups need not wait for it.
// Until they are gone the address stays taken and the same id cannot be
// attached again (unlinking).
func (m *Manager) Detach(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.mu.Lock()
	u, err := m.forgetLocked(id)
	gen := m.gen
	m.mu.Unlock()
	outsideLock("unlinking", id)
	err = errors.Join(err, u.remove(ctx))
	m.mu.Lock()
	m.unlinkedLocked(u)
	m.mu.Unlock()
	return errors.Join(err, m.sync(ctx, gen))
}

// detachLocked is Detach without its load, all under m.mu (Reconcile,
// Teardown, a failed attach): it queues the ruleset delta without the
// sandbox, loaded by the caller (Reconcile's final load; Teardown removes
// the tables).
func (m *Manager) detachLocked(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	u, err := m.forgetLocked(id)
	err = errors.Join(err, u.remove(ctx))
	m.unlinkedLocked(u)
	return err
}

// outsideLock is called where Attach and Detach work on one sandbox's
// kernel objects without m.mu (stage "attaching", "unlinking"); tests
// hold it there.
var outsideLock = func(stage, id string) {}

// unlinking is a detached sandbox whose veth and namespace are being
// removed: its address is not handed out and its id not attached again
// until done is closed.
type unlinking struct {
	id, veth string
	ip       netip.Addr
	known    bool
	netns    string
	done     chan struct{}
}

// forgetLocked removes id's attachment from the state, the proxy and the
// ruleset to load (a delta), and returns the kernel objects left to remove.
func (m *Manager) forgetLocked(id string) (*unlinking, error) {
	r, known := m.sbs[id]
	if m.cfg.Egress != nil {
		m.cfg.Egress.RemoveSandbox(id)
	}
	u := &unlinking{id: id, veth: m.vethName(id), known: known, netns: m.netnsPath(id), done: make(chan struct{})}
	if known {
		sb := sandboxNet(id, r)
		delete(m.sbs, id)
		if checkSandboxNet(m.plan, sb) != nil {
			// Not one the ruleset can name (Setup drops those): the next
			// load is a whole one, without it.
			m.markStaleLocked()
			m.changedLocked()
		} else {
			m.changedLocked(delta{opDetach, sb})
		}
		if r.IP.IsValid() {
			m.recent[id] = r.IP
		}
		u.veth, u.ip = r.Veth, r.IP
	}
	if _, busy := m.unlinking[id]; !busy { // a second Detach meanwhile removes the same, harmlessly
		m.unlinking[id] = u
	}
	return u, m.saveLocked()
}

// remove deletes u's veth and namespace (a missing one is fine).
func (u *unlinking) remove(ctx context.Context) error {
	return errors.Join(deleteLink(ctx, u.veth), deleteNetns(u.netns))
}

// unlinkedLocked ends u: its address and id are free again.
func (m *Manager) unlinkedLocked(u *unlinking) {
	if m.unlinking[u.id] == u {
		delete(m.unlinking, u.id)
	}
	close(u.done)
	if u.known {
		m.log.Info("network detached", "sandbox_id", u.id)
	}
}

// waitUnlinkedLocked returns with m.mu held once no removal of id's veth
// and namespace is under way (releasing m.mu while it waits).
func (m *Manager) waitUnlinkedLocked(ctx context.Context, id string) error {
	for {
		u, ok := m.unlinking[id]
		if !ok {
			return nil
		}
		m.mu.Unlock()
		select {
		case <-u.done:
			m.mu.Lock()
		case <-ctx.Done():
			m.mu.Lock()
			return errs.Wrap(errs.Unavailable, ctx.Err(), "sandbox %s: its previous network is still being removed", id)
		}
	}
}

// Reconcile detaches every sandbox not in liveIDs and removes namespaces and
// veths that belong to no known sandbox (leftovers of a crash).
func (m *Manager) Reconcile(ctx context.Context, liveIDs []string) error {
	live := map[string]bool{}
	for _, id := range liveIDs {
		live[id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errList []error
	for id := range m.sbs {
		if !live[id] {
			errList = append(errList, m.detachLocked(ctx, id))
		}
	}
	entries, _ := os.ReadDir(m.netnsDir())
	for _, e := range entries {
		if _, ok := m.sbs[e.Name()]; !ok {
			m.log.Info("removing stale netns", "sandbox_id", e.Name())
			errList = append(errList, deleteNetns(filepath.Join(m.netnsDir(), e.Name())))
		}
	}
	want := map[string]bool{}
	for _, r := range m.sbs {
		want[r.Veth] = true
	}
	links, err := listLinks(ctx, m.cfg.VethPrefix)
	errList = append(errList, err)
	for _, l := range links {
		if !want[l] {
			m.log.Info("removing stale veth", "veth", l)
			errList = append(errList, deleteLink(ctx, l))
		}
	}
	// Setup loaded this very state moments ago at a daemon start: a load is
	// only needed when something was detached since (its deltas), or the
	// last load failed (the whole ruleset).
	if !m.loads.current(m.gen) {
		errList = append(errList, m.loadLocked(ctx, false))
	}
	return errors.Join(errList...)
}

// Teardown detaches every sandbox and removes the ruleset and the bridge
// (uninstall, tests). ip_forward is left as it is: other software may need it.
func (m *Manager) Teardown(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errList []error
	ids := make([]string, 0, len(m.sbs))
	for id := range m.sbs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		errList = append(errList, m.detachLocked(ctx, id))
	}
	m.nftMu.Lock()
	m.pending, m.stale = nil, true // no tables: a later Setup loads them whole
	errList = append(errList, nftApply(ctx, PlanDelete(m.cfg.Table)), deleteLink(ctx, m.cfg.BridgeName))
	m.nftMu.Unlock()
	return errors.Join(errList...)
}

// DialSandbox connects from the host to a port of a sandbox (port exposure
// through berth's HTTP proxy).
func (m *Manager) DialSandbox(ctx context.Context, id string, port uint16) (net.Conn, error) {
	att, ok := m.Get(id)
	if !ok {
		return nil, errs.E(errs.NotFound, "sandbox %s has no network", id)
	}
	return DialSandbox(ctx, att.IP, port)
}

// DialSandbox connects from the host to sandboxIP:port.
func DialSandbox(ctx context.Context, sandboxIP netip.Addr, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, errs.Field("port", "must be 1-65535")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort(sandboxIP.String(), strconv.Itoa(int(port))))
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "dial sandbox port %d", port)
	}
	return c, nil
}

// markStaleLocked makes the next load a whole one.
func (m *Manager) markStaleLocked() {
	m.nftMu.Lock()
	m.stale = true
	m.nftMu.Unlock()
}

func sandboxNet(id string, r *record) SandboxNet {
	return SandboxNet{ID: id, IP: r.IP, Veth: r.Veth, Policy: r.Policy}
}

// planLocked renders the ruleset of every attached sandbox.
func (m *Manager) planLocked() (string, error) {
	sbs := make([]SandboxNet, 0, len(m.sbs))
	for id, r := range m.sbs {
		if r.attaching {
			continue
		}
		sbs = append(sbs, sandboxNet(id, r))
	}
	return Plan(m.plan, sbs)
}

// allocLocked picks the lowest free address after the gateway.
func (m *Manager) allocLocked(id string) (netip.Addr, error) {
	used := map[netip.Addr]bool{}
	for _, r := range m.sbs {
		used[r.IP] = true
	}
	for _, u := range m.unlinking { // its veth may still answer for it on the bridge
		used[u.ip] = true
	}
	if a, ok := m.recent[id]; ok {
		delete(m.recent, id)
		if !used[a] && m.cfg.Subnet.Contains(a) && m.cfg.Gateway().Less(a) && a.Less(lastAddr(m.cfg.Subnet)) {
			return a, nil
		}
	}
	heldBy := map[netip.Addr]string{}
	for other, a := range m.recent {
		heldBy[a] = other
	}
	last := lastAddr(m.cfg.Subnet)
	var fallback netip.Addr
	for a := m.cfg.Gateway().Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if used[a] {
			continue
		}
		if _, held := heldBy[a]; !held {
			return a, nil
		}
		if !fallback.IsValid() {
			fallback = a
		}
	}
	if fallback.IsValid() { // every free address was someone's last: the lowest, its claim dropped
		delete(m.recent, heldBy[fallback])
		return fallback, nil
	}
	return netip.Addr{}, errs.E(errs.ResourceExhausted, "no free address in %s", m.cfg.Subnet)
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (m *Manager) vethName(id string) string {
	h := sha256.Sum256([]byte(m.cfg.Table + "/" + id))
	return m.cfg.VethPrefix + hex.EncodeToString(h[:])[:15-len(m.cfg.VethPrefix)]
}

func (m *Manager) netnsDir() string           { return filepath.Join(m.cfg.StateDir, "netns") }
func (m *Manager) netnsPath(id string) string { return filepath.Join(m.netnsDir(), id) }
func (m *Manager) statePath() string          { return filepath.Join(m.cfg.StateDir, "network.json") }

func (m *Manager) saveLocked() error {
	b, err := json.MarshalIndent(m.sbs, "", "  ")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode network state")
	}
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create state dir")
	}
	tmp := m.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return errs.Wrap(errs.Internal, err, "write network state")
	}
	if err := os.Rename(tmp, m.statePath()); err != nil {
		return errs.Wrap(errs.Internal, err, "write network state")
	}
	return nil
}

package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// Decision is one egress log entry: every connection and DNS answer the
// proxy decides on. Allowed connections are reported when they end, with
// their byte counts; denials at once.
type Decision struct {
	Time        time.Time
	SandboxID   string
	Proto       string // "tcp" or "dns"
	DstIP       netip.Addr
	DstPort     uint16
	Host        string // SNI, HTTP Host or DNS name; "" if none
	Rule        string // the deciding rule, see Verdict.Rule
	Verdict     string // "allow" or "deny"
	Reason      string // why a denial or failure happened beyond the rule, e.g. "private-address"
	Intercepted bool   // TLS was terminated to inject a credential
	BytesOut    int64  // sandbox → upstream
	BytesIn     int64  // upstream → sandbox
	Duration    time.Duration
}

// Config configures a Proxy.
type Config struct {
	// ProxyAddr is where nftables sends every TCP connection of a sandbox
	// (network.Manager dnats to it), e.g. 10.88.0.1:15001.
	ProxyAddr netip.AddrPort
	// DNSAddr serves DNS (UDP and TCP) to sandboxes, e.g. 10.88.0.1:53.
	DNSAddr netip.AddrPort
	// CA signs certificates for intercepted hosts; nil disables credential
	// injection (SetGrants then fails).
	CA *CA
	// ExtraCAFile is a PEM bundle trusted for upstream TLS in addition to
	// the host's trust store.
	ExtraCAFile string
	// HostsFile is read before the host's resolver; default /etc/hosts.
	HostsFile string
	// Blocked are ranges never dialled, whatever the policy (the sandbox
	// subnet). The host's own addresses, loopback and link-local always are.
	Blocked []netip.Prefix
	// PeekTimeout bounds the wait for a ClientHello or request line; default 1s.
	PeekTimeout time.Duration
	// DialTimeout bounds an upstream dial; default 10s.
	DialTimeout time.Duration
	// AllowPrivate are the private and link-local ranges the operator opens
	// to sandboxes (berth serve --allow-private-egress). Outside them no
	// sandbox reaches a private address, whatever its rules.
	AllowPrivate []netip.Prefix
	// UpstreamDNS, when set, is the resolver the proxy asks for names the
	// hosts file does not hold, instead of the host's /etc/resolv.conf.
	UpstreamDNS netip.AddrPort
	// Per-sandbox caps, so that one sandbox cannot take the proxy's or the
	// resolver's goroutines and descriptors from the others. Zero means the
	// default; see DefaultLimits.
	MaxConns       int // concurrent proxied TCP connections (and DNS-over-TCP)
	MaxDNSInFlight int // DNS queries being answered at once
	DNSQPS         int // DNS queries per second (burst: twice that)
	// OnLimit is called (at most every LimitReportEvery per sandbox and
	// limit) when a sandbox hits a cap; limit is "connections",
	// "dns_inflight" or "dns_rate". It must not block. Optional.
	OnLimit func(sandboxID, limit string, max int)
	// Sink receives every decision; it must not block for long. Optional.
	Sink func(Decision)
	Log  *slog.Logger
}

// Proxy is the transparent egress proxy and DNS resolver shared by every
// sandbox on the host. It identifies a sandbox by its source address (the
// bridge's nftables rules pin each veth to its address).
type Proxy struct {
	cfg      Config
	log      *slog.Logger
	res      *resolver
	upRoots  *x509.CertPool
	localTTL time.Duration

	mu      sync.Mutex
	ledger  Ledger // side effects (effects.go); nil: none
	byIP    map[netip.Addr]*sandboxState
	byID    map[string]*sandboxState
	ready   chan struct{}
	running bool
	local   []netip.Addr
	localAt time.Time
}

type sandboxState struct {
	id     string
	ip     netip.Addr
	policy Policy
	grants []Grant
	conns  map[*activeConn]struct{}

	// Guarded by Proxy.mu: usage against the per-sandbox caps.
	nconns     int // accepted TCP connections not yet closed (peeking included)
	dnsActive  int
	dnsTokens  float64
	dnsRefill  time.Time
	limitShown map[string]time.Time
}

type activeConn struct {
	q      Query
	upIP   netip.Addr
	closer func()
}

// New validates cfg and builds a proxy; Run serves it.
func New(cfg Config) (*Proxy, error) {
	if !cfg.ProxyAddr.IsValid() {
		return nil, errs.Field("egress.proxy_addr", "must be an address:port")
	}
	if !cfg.DNSAddr.IsValid() {
		return nil, errs.Field("egress.dns_addr", "must be an address:port")
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	def := DefaultLimits()
	for _, l := range []struct {
		v    *int
		def  int
		name string
	}{{&cfg.MaxConns, def.MaxConns, "egress_max_conns_per_sandbox"}, {&cfg.MaxDNSInFlight, def.MaxDNSInFlight, "egress_max_dns_inflight_per_sandbox"},
		{&cfg.DNSQPS, def.DNSQPS, "egress_dns_qps_per_sandbox"}} {
		if *l.v < 0 {
			return nil, errs.Field(l.name, "must not be negative, got %d", *l.v)
		}
		if *l.v == 0 {
			*l.v = l.def
		}
	}
	for i, pfx := range cfg.AllowPrivate {
		if !pfx.IsValid() {
			return nil, errs.Field("allow_private_egress", "invalid prefix %v", pfx)
		}
		cfg.AllowPrivate[i] = pfx.Masked()
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if cfg.ExtraCAFile != "" {
		pemBytes, err := os.ReadFile(cfg.ExtraCAFile)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, err, "egress.extra_ca_file")
		}
		if !roots.AppendCertsFromPEM(pemBytes) {
			return nil, errs.Field("egress.extra_ca_file", "%s holds no PEM certificate", cfg.ExtraCAFile)
		}
	}
	return &Proxy{
		cfg: cfg, log: cfg.Log, res: newResolver(cfg.HostsFile, cfg.UpstreamDNS), upRoots: roots, localTTL: 5 * time.Second,
		byIP: map[netip.Addr]*sandboxState{}, byID: map[string]*sandboxState{}, ready: make(chan struct{}),
	}, nil
}

// Limits are the per-sandbox caps of a Proxy.
type Limits struct{ MaxConns, MaxDNSInFlight, DNSQPS int }

// DefaultLimits are the caps used where Config leaves them zero: generous
// for one agent, small against the host's file descriptor limit.
func DefaultLimits() Limits { return Limits{MaxConns: 256, MaxDNSInFlight: 32, DNSQPS: 100} }

// LimitReportEvery is how often, at most, a sandbox's hitting one cap is
// reported (OnLimit and the egress log): a flood must not flood the log.
const LimitReportEvery = 10 * time.Second

// OpenPrivate returns the private ranges the server opened (Config.AllowPrivate).
func (p *Proxy) OpenPrivate() []netip.Prefix {
	return append([]netip.Prefix(nil), p.cfg.AllowPrivate...)
}

// CheckPolicy refuses a tenant's policy whose allow rules name a private or
// link-local range the server did not open (see CheckRanges).
func (p *Proxy) CheckPolicy(pol Policy) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	return CheckRanges(pol, p.cfg.AllowPrivate)
}

// SetSandbox registers a sandbox's address and policy, or replaces its
// policy. The swap is atomic for new connections and DNS answers; open
// connections that the new policy denies are closed before it returns, so
// no connection outlives the policy that allowed it.
func (p *Proxy) SetSandbox(id string, ip netip.Addr, pol Policy) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	ip = ip.Unmap()
	p.mu.Lock()
	st := p.byID[id]
	if st == nil {
		st = &sandboxState{id: id, conns: map[*activeConn]struct{}{}, limitShown: map[string]time.Time{}}
		p.byID[id] = st
	}
	if st.ip.IsValid() && st.ip != ip {
		delete(p.byIP, st.ip)
	}
	if other := p.byIP[ip]; other != nil && other != st {
		p.mu.Unlock()
		return errs.E(errs.Conflict, "address %s already belongs to sandbox %s", ip, other.id)
	}
	st.ip, st.policy = ip, pol
	p.byIP[ip] = st
	var doomed []func()
	for c := range st.conns {
		if !p.stillAllowedLocked(pol, c) {
			doomed = append(doomed, c.closer)
		}
	}
	p.mu.Unlock()
	for _, f := range doomed {
		f()
	}
	return nil
}

func (p *Proxy) stillAllowedLocked(pol Policy, c *activeConn) bool {
	if !Decide(pol, c.q).Allow {
		return false
	}
	return pol.ipAllowed(c.upIP, c.q.Port, p.cfg.AllowPrivate)
}

// SetGrants replaces the credentials granted to a registered sandbox.
// Requests already in flight keep the grants they were sent with; the next
// request on any connection sees the new set.
func (p *Proxy) SetGrants(id string, grants []Grant) error {
	if len(grants) > 0 && p.cfg.CA == nil {
		return errs.E(errs.FailedPrecondition, "credential injection needs a CA (egress.Config.CA)")
	}
	for _, g := range grants {
		if err := g.Validate(); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.byID[id]
	if st == nil {
		return errs.E(errs.NotFound, "sandbox %s has no network attachment", id)
	}
	st.grants = append([]Grant(nil), grants...)
	return nil
}

// FreezeGrants marks a registered sandbox's active grants frozen (its
// pause): from the next request none is injected, and their values are
// dropped from memory. A later SetGrants replaces them.
func (p *Proxy) FreezeGrants(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.byID[id]
	if st == nil {
		return
	}
	gs := make([]Grant, len(st.grants))
	for i, g := range st.grants {
		if g.State == GrantActive {
			g.State, g.Value = GrantFrozen, ""
		}
		gs[i] = g
	}
	st.grants = gs // a new slice: requests in flight keep the set they read
}

// RemoveSandbox forgets a sandbox and closes its open connections.
func (p *Proxy) RemoveSandbox(id string) {
	p.mu.Lock()
	st := p.byID[id]
	var doomed []func()
	if st != nil {
		delete(p.byID, id)
		if p.byIP[st.ip] == st {
			delete(p.byIP, st.ip)
		}
		for c := range st.conns {
			doomed = append(doomed, c.closer)
		}
	}
	p.mu.Unlock()
	for _, f := range doomed {
		f()
	}
}

// snapshot returns the sandbox owning src with a copy of its policy.
func (p *Proxy) snapshot(src netip.Addr) (*sandboxState, Policy, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.byIP[src.Unmap()]
	if st == nil {
		return nil, Policy{}, false
	}
	return st, st.policy, true
}

func (p *Proxy) grantsFor(st *sandboxState, host string) []Grant {
	host = normalizeHost(host)
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Grant
	for _, g := range st.grants {
		if normalizeHost(g.Host) == host {
			g.refuse = func(verdict, reason string) {
				p.emit(Decision{SandboxID: st.id, Proto: "tcp", DstPort: 443, Host: host, Rule: "secret:" + g.Name,
					Verdict: verdict, Reason: reason, Intercepted: true})
			}
			out = append(out, g)
		}
	}
	return out
}

func (p *Proxy) track(st *sandboxState, c *activeConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID[st.id] != st || !p.stillAllowedLocked(st.policy, c) {
		return false // removed or tightened between decision and dial
	}
	st.conns[c] = struct{}{}
	return true
}

// acquireConn counts one more open connection of st against its cap.
func (p *Proxy) acquireConn(st *sandboxState) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st.nconns >= p.cfg.MaxConns {
		return false
	}
	st.nconns++
	return true
}

func (p *Proxy) releaseConn(st *sandboxState) {
	p.mu.Lock()
	st.nconns--
	p.mu.Unlock()
}

// acquireDNS admits one query of st against its in-flight and rate caps;
// limit names the cap that refused it.
func (p *Proxy) acquireDNS(st *sandboxState, now time.Time) (ok bool, limit string, max int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	burst := float64(2 * p.cfg.DNSQPS)
	if st.dnsRefill.IsZero() {
		st.dnsTokens = burst
	} else {
		st.dnsTokens = min(burst, st.dnsTokens+now.Sub(st.dnsRefill).Seconds()*float64(p.cfg.DNSQPS))
	}
	st.dnsRefill = now
	if st.dnsTokens < 1 {
		return false, "dns_rate", p.cfg.DNSQPS
	}
	if st.dnsActive >= p.cfg.MaxDNSInFlight {
		return false, "dns_inflight", p.cfg.MaxDNSInFlight
	}
	st.dnsTokens--
	st.dnsActive++
	return true, "", 0
}

func (p *Proxy) releaseDNS(st *sandboxState) {
	p.mu.Lock()
	st.dnsActive--
	p.mu.Unlock()
}

// limitHit reports that st hit a cap, at most every LimitReportEvery.
func (p *Proxy) limitHit(st *sandboxState, proto, limit string, max int) {
	now := time.Now()
	p.mu.Lock()
	if last, ok := st.limitShown[limit]; ok && now.Sub(last) < LimitReportEvery {
		p.mu.Unlock()
		return
	}
	st.limitShown[limit] = now
	p.mu.Unlock()
	p.log.Warn("egress: sandbox hit a cap", "sandbox_id", st.id, "limit", limit, "max", max)
	p.emit(Decision{Time: now, SandboxID: st.id, Proto: proto, Verdict: "deny", Rule: "limit:" + limit,
		Reason: "per-sandbox cap of " + strconv.Itoa(max) + " reached"})
	if p.cfg.OnLimit != nil {
		p.cfg.OnLimit(st.id, limit, max)
	}
}

func (p *Proxy) untrack(st *sandboxState, c *activeConn) {
	p.mu.Lock()
	delete(st.conns, c)
	p.mu.Unlock()
}

// Run serves the proxy and DNS until ctx ends, then closes every connection
// and returns. It fails at once if it cannot bind. Run may be called again
// after it returned (the daemon supervises restarts); while it is not
// running, sandboxes have no egress and no DNS (fail closed).
func (p *Proxy) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errs.E(errs.FailedPrecondition, "egress proxy already running")
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.ready = make(chan struct{})
		p.mu.Unlock()
	}()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp4", p.cfg.ProxyAddr.String())
	if err != nil {
		return errs.Wrap(errs.Unavailable, err, "egress proxy listen")
	}
	dnsUDP, err := lc.ListenPacket(ctx, "udp4", p.cfg.DNSAddr.String())
	if err != nil {
		ln.Close()
		return errs.Wrap(errs.Unavailable, err, "egress dns listen")
	}
	dnsTCP, err := lc.Listen(ctx, "tcp4", p.cfg.DNSAddr.String())
	if err != nil {
		ln.Close()
		dnsUDP.Close()
		return errs.Wrap(errs.Unavailable, err, "egress dns listen")
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.acceptLoop(runCtx, ln.(*net.TCPListener), &wg) })
	wg.Go(func() { p.serveDNSUDP(runCtx, dnsUDP.(*net.UDPConn), &wg) })
	wg.Go(func() { p.serveDNSTCP(runCtx, dnsTCP.(*net.TCPListener), &wg) })
	p.mu.Lock()
	close(p.ready)
	p.mu.Unlock()
	p.log.Info("egress proxy serving", "proxy", p.cfg.ProxyAddr.String(), "dns", p.cfg.DNSAddr.String())

	<-ctx.Done()
	cancel()
	ln.Close()
	dnsUDP.Close()
	dnsTCP.Close()
	p.mu.Lock()
	var doomed []func()
	for _, st := range p.byID {
		for c := range st.conns {
			doomed = append(doomed, c.closer)
		}
	}
	p.mu.Unlock()
	for _, f := range doomed {
		f()
	}
	wg.Wait()
	return nil
}

// WaitReady blocks until Run is listening or ctx ends.
func (p *Proxy) WaitReady(ctx context.Context) error {
	p.mu.Lock()
	ch := p.ready
	p.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return errs.Wrap(errs.Unavailable, ctx.Err(), "egress proxy not ready")
	}
}

func (p *Proxy) acceptLoop(ctx context.Context, ln *net.TCPListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				p.log.Warn("egress accept", "err", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return
		}
		wg.Go(func() { p.handle(ctx, c) })
	}
}

func (p *Proxy) emit(d Decision) {
	if d.Time.IsZero() {
		d.Time = time.Now()
	}
	if p.cfg.Sink != nil {
		p.cfg.Sink(d)
	}
	p.log.Debug("egress", "sandbox_id", d.SandboxID, "proto", d.Proto, "dst", d.DstIP.String(),
		"port", d.DstPort, "host", d.Host, "rule", d.Rule, "verdict", d.Verdict, "reason", d.Reason)
}

// dialable is the last check before any upstream dial.
func (p *Proxy) dialable(pol Policy, ip netip.Addr, port uint16) bool {
	ip = ip.Unmap()
	if !pol.ipAllowed(ip, port, p.cfg.AllowPrivate) {
		return false
	}
	return !inAny(p.cfg.Blocked, ip) && !p.isLocal(ip)
}

// isLocal reports whether ip is one of the host's own addresses: a sandbox
// must not reach host services through the proxy.
func (p *Proxy) isLocal(ip netip.Addr) bool {
	p.mu.Lock()
	if time.Since(p.localAt) > p.localTTL {
		p.local = p.local[:0]
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil {
					p.local = append(p.local, pfx.Addr().Unmap())
				}
			}
		}
		p.localAt = time.Now()
	}
	defer p.mu.Unlock()
	for _, l := range p.local {
		if l == ip {
			return true
		}
	}
	return false
}

func (p *Proxy) upstreamTLS(host string) *tls.Config {
	return &tls.Config{ServerName: host, RootCAs: p.upRoots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
}

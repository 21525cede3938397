//go:build linux && !clientonly

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/hostnet"
	"github.com/berth-dev/berth/internal/network"
)

// NetworkServeConfig is the networking part of `berth serve`'s config,
// embedded in ServeConfig (its keys sit at the top level of the file).
type NetworkServeConfig struct {
	DefaultNetwork  string `json:"default_network"`   // deny-all (default) or allow-all
	UpstreamCA      string `json:"upstream_ca"`       // PEM bundle trusted for upstream TLS
	EgressHosts     string `json:"egress_hosts_file"` // hosts file the egress resolver reads first
	NetworkDisabled bool   `json:"network_disabled"`  // no bridge, no proxy: every sandbox deny-all
	Bridge          string `json:"network_bridge"`    // default berth0
	Subnet          string `json:"network_subnet"`    // default 10.88.0.0/16
	Table           string `json:"network_table"`     // nftables table, default berth
	VethPrefix      string `json:"network_veth_prefix"`
	ProxyPort       int    `json:"egress_proxy_port"` // default 15001
	DNSPort         int    `json:"egress_dns_port"`   // default 53
	// AllowPrivateEgress are the private/link-local CIDRs (the operator's
	// networks) sandboxes may reach; a tenant rule can never open them.
	AllowPrivateEgress []string `json:"allow_private_egress"`
	EgressResolver     string   `json:"egress_resolver"` // ADDR:PORT asked instead of /etc/resolv.conf
	// Per-sandbox egress caps; 0 = default (egress.DefaultLimits).
	EgressMaxConns       int `json:"egress_max_conns_per_sandbox"`
	EgressMaxDNSInFlight int `json:"egress_max_dns_inflight_per_sandbox"`
	EgressDNSQPS         int `json:"egress_dns_qps_per_sandbox"`
}

// cidrList is a repeatable flag that also takes comma-separated values.
type cidrList []string

func (l *cidrList) String() string { return strings.Join(*l, ",") }
func (l *cidrList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// networkFlags registers serve's networking flags; apply copies the ones
// given over the config.
func networkFlags(fs *flag.FlagSet) (apply func(*NetworkServeConfig)) {
	var n NetworkServeConfig
	fs.StringVar(&n.DefaultNetwork, "default-network", "", "policy of sandboxes created without one: deny-all (default) or allow-all")
	fs.StringVar(&n.UpstreamCA, "upstream-ca", "", "PEM file of CAs the egress proxy trusts for upstream TLS (besides the host's)")
	fs.StringVar(&n.EgressHosts, "egress-hosts", "", "hosts file the egress resolver reads before the host's resolver")
	noNet := fs.Bool("no-network", false, "disable sandbox networking (every sandbox deny-all, no proxy)")
	fs.StringVar(&n.Bridge, "network-bridge", "", "bridge name (default berth0)")
	fs.StringVar(&n.Subnet, "network-subnet", "", "sandbox subnet (default 10.88.0.0/16)")
	fs.StringVar(&n.Table, "network-table", "", "nftables table name (default berth)")
	fs.StringVar(&n.VethPrefix, "network-veth-prefix", "", "host-side veth name prefix, 1-4 chars (default bv)")
	fs.IntVar(&n.ProxyPort, "egress-proxy-port", 0, "egress proxy port on the gateway (default 15001)")
	fs.IntVar(&n.DNSPort, "egress-dns-port", 0, "egress resolver port on the gateway (default 53)")
	var private cidrList
	fs.Var(&private, "allow-private-egress", "CIDR of a private or link-local range sandboxes may reach (repeatable; none by default)")
	fs.StringVar(&n.EgressResolver, "egress-resolver", "", "ADDR:PORT of the DNS resolver the egress proxy asks (default: the host's /etc/resolv.conf)")
	def := egress.DefaultLimits()
	fs.IntVar(&n.EgressMaxConns, "egress-max-conns", 0, fmt.Sprintf("concurrent egress connections per sandbox (default %d)", def.MaxConns))
	fs.IntVar(&n.EgressMaxDNSInFlight, "egress-max-dns-inflight", 0, fmt.Sprintf("DNS queries in flight per sandbox (default %d)", def.MaxDNSInFlight))
	fs.IntVar(&n.EgressDNSQPS, "egress-dns-qps", 0, fmt.Sprintf("DNS queries per second per sandbox (default %d)", def.DNSQPS))
	return func(c *NetworkServeConfig) {
		if len(private) > 0 {
			c.AllowPrivateEgress = private
		}
		if n.EgressResolver != "" {
			c.EgressResolver = n.EgressResolver
		}
		for p, v := range map[*int]int{&c.EgressMaxConns: n.EgressMaxConns, &c.EgressMaxDNSInFlight: n.EgressMaxDNSInFlight, &c.EgressDNSQPS: n.EgressDNSQPS} {
			if v != 0 {
				*p = v
			}
		}
		for p, v := range map[*string]string{&c.DefaultNetwork: n.DefaultNetwork, &c.UpstreamCA: n.UpstreamCA,
			&c.EgressHosts: n.EgressHosts, &c.Bridge: n.Bridge, &c.Subnet: n.Subnet, &c.Table: n.Table, &c.VethPrefix: n.VethPrefix} {
			if v != "" {
				*p = v
			}
		}
		if n.ProxyPort != 0 {
			c.ProxyPort = n.ProxyPort
		}
		if n.DNSPort != 0 {
			c.DNSPort = n.DNSPort
		}
		if *noNet {
			c.NetworkDisabled = true
		}
	}
}

// Validate names the bad key.
func (c *NetworkServeConfig) Validate() error {
	switch egress.Mode(c.DefaultNetwork) {
	case "", egress.DenyAll, egress.AllowAll:
	default:
		return errs.Field("default_network", "must be deny-all or allow-all, got %q", c.DefaultNetwork)
	}
	if c.Subnet != "" {
		if p, err := netip.ParsePrefix(c.Subnet); err != nil || !p.Addr().Is4() {
			return errs.Field("network_subnet", "must be an IPv4 CIDR like 10.88.0.0/16, got %q", c.Subnet)
		}
	}
	for k, v := range map[string]int{"egress_proxy_port": c.ProxyPort, "egress_dns_port": c.DNSPort} {
		if v < 0 || v > 65535 {
			return errs.Field(k, "must be 1-65535, got %d", v)
		}
	}
	for _, v := range c.AllowPrivateEgress {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return errs.Field("allow_private_egress", "%q is not a CIDR like 10.20.0.0/16", v)
		}
		if !privateRange(p) {
			return errs.Field("allow_private_egress", "%s is not inside a private or link-local range (%v); public ranges need no opening", v, egress.PrivatePrefixes())
		}
	}
	if c.EgressResolver != "" {
		if _, err := netip.ParseAddrPort(c.EgressResolver); err != nil {
			return errs.Field("egress_resolver", "want ADDR:PORT like 127.0.0.1:53, got %q", c.EgressResolver)
		}
	}
	for k, v := range map[string]int{"egress_max_conns_per_sandbox": c.EgressMaxConns,
		"egress_max_dns_inflight_per_sandbox": c.EgressMaxDNSInFlight, "egress_dns_qps_per_sandbox": c.EgressDNSQPS} {
		if v < 0 {
			return errs.Field(k, "must not be negative, got %d", v)
		}
	}
	for k, v := range map[string]string{"upstream_ca": c.UpstreamCA, "egress_hosts_file": c.EgressHosts} {
		if v == "" {
			continue
		}
		if _, err := os.Stat(v); err != nil {
			return errs.Field(k, "cannot read %s: %v", v, err)
		}
	}
	return nil
}

// startNetwork sets up sandbox networking unless it is disabled.
func startNetwork(ctx context.Context, d *daemon.Daemon, c NetworkServeConfig) error {
	if c.NetworkDisabled {
		return nil
	}
	ncfg := network.Config{BridgeName: c.Bridge, Table: c.Table, VethPrefix: c.VethPrefix,
		ProxyPort: uint16(c.ProxyPort), DNSPort: uint16(c.DNSPort)}
	if c.Subnet != "" {
		ncfg.Subnet = netip.MustParsePrefix(c.Subnet)
	}
	o := hostnet.Options{Network: ncfg, UpstreamCA: c.UpstreamCA, HostsFile: c.EgressHosts,
		DefaultMode: egress.Mode(c.DefaultNetwork),
		Limits:      egress.Limits{MaxConns: c.EgressMaxConns, MaxDNSInFlight: c.EgressMaxDNSInFlight, DNSQPS: c.EgressDNSQPS}}
	for _, v := range c.AllowPrivateEgress {
		o.AllowPrivate = append(o.AllowPrivate, netip.MustParsePrefix(v).Masked())
	}
	if c.EgressResolver != "" {
		o.UpstreamDNS = netip.MustParseAddrPort(c.EgressResolver)
	}
	return d.Net().Start(ctx, o)
}

// privateRange reports whether p lies inside one private or link-local range.
func privateRange(p netip.Prefix) bool {
	for _, r := range egress.PrivatePrefixes() {
		if p.Addr().BitLen() == r.Addr().BitLen() && p.Bits() >= r.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// deriveNetwork gives a server whose data dir is not the default its own
// bridge, nftables table, veth prefix and /22 subnet. Two servers on one
// host (a test server next to the real one, a bench --self run) then never
// share a bridge, a table or a proxy address. Explicit settings always win.
//
// The names are derived from the data dir's path; the subnet is the first
// /22 of a path-derived sequence the host does not use. Once a server ran,
// the layout it used (DATA_DIR/network/layout.json) is taken over as it is:
// after a restart with sandboxes still running, the server's own bridge
// occupies its subnet and must not push it to another one.
func deriveNetwork(dataDir string, c *NetworkServeConfig) {
	if filepath.Clean(dataDir) == defaultDataDir {
		return
	}
	h := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	tag := hex.EncodeToString(h[:3])
	saved, ok, _ := network.SavedLayout(filepath.Join(dataDir, "network"))
	pick := func(p *string, savedV, derived string) {
		switch {
		case *p != "":
		case ok && savedV != "":
			*p = savedV
		default:
			*p = derived
		}
	}
	pick(&c.Bridge, saved.Bridge, "bb"+tag) // 8 chars; interface names stop at 15
	pick(&c.Table, saved.Table, "berth_"+tag)
	pick(&c.VethPrefix, saved.VethPrefix, "v"+tag[:3])
	if c.Subnet == "" && ok {
		c.Subnet = saved.Subnet.String()
	}
	if c.Subnet == "" {
		// 10.200.0.0/13 carved into /22s, skipping ranges the host uses
		// (the server's own bridge excepted: it is ours to reuse). A /22,
		// not a /24: a /24 stopped a server at 253 sandboxes, and the
		// scale bench runs 1,000 on one (a bridge takes 1,024 ports).
		for i := 0; i < 64; i++ {
			n := (uint32(h[3])<<8 | uint32(h[4])) + uint32(i)*7919
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + (n>>8)%8), byte(n) &^ 3, 0}), 22)
			if !hostUses(p, c.Bridge) {
				c.Subnet = p.String()
				return
			}
		}
	}
}

// hostUses reports whether an address of a host interface other than
// except lies in p.
func hostUses(p netip.Prefix, except string) bool {
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Name == except {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Overlaps(p) {
				return true
			}
		}
	}
	return false
}

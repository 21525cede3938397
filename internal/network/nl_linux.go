package network

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
)

// The deltas go to the kernel over netlink, in-process (google/nftables),
// as one batch: an exec of nft for them cost ~10–30 ms, most of it the
// process and its dump of every chain of the ruleset (so it still grew
// with the number of sandboxes). The expressions below are the bytecode
// nft compiles sandboxChains' text to (nft --debug=netlink), so a
// sandbox's chains are the same whichever path loaded them;
// TestIncrementalMatchesPlan compares the kernel's rules of both, byte for
// byte. The whole ruleset (Plan) stays an nft script.

// applyDeltas sends the deltas of ds in one netlink batch: one kernel
// transaction, all or nothing.
func applyDeltas(cfg PlanConfig, ds []delta) error {
	c, err := nftables.New()
	if err != nil {
		return errs.Wrap(errs.Internal, err, "nftables netlink")
	}
	for _, d := range ds {
		if err := queueDelta(c, cfg, d); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		kind := errs.Internal
		if errors.Is(err, unix.EPERM) {
			kind = errs.FailedPrecondition
		}
		return errs.Wrap(kind, err, "nftables: apply %d ruleset delta(s)", len(ds))
	}
	return nil
}

func queueDelta(c *nftables.Conn, cfg PlanConfig, d delta) error {
	if err := checkSandboxNet(cfg, d.sb); err != nil {
		return err
	}
	bridge := &nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table}
	inet := &nftables.Table{Family: nftables.TableFamilyINet, Name: cfg.Table}
	tableOf := func(family string) *nftables.Table {
		if family == "bridge" {
			return bridge
		}
		return inet
	}
	sb := d.sb
	ports := &nftables.Set{Table: bridge, Name: "ports", IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	pre4 := &nftables.Set{Table: inet, Name: "pre4", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	fwd4 := &nftables.Set{Table: inet, Name: "fwd4", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	ip := sb.IP.AsSlice()
	elem := func(key []byte, chain string) []nftables.SetElement {
		return []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}
	}
	chains := sandboxExprs(cfg, sb)
	switch d.op {
	case opAttach, opUpdate:
		for _, ch := range chains {
			if d.op == opUpdate && ch.family == "bridge" {
				continue // the port chain depends on the address alone
			}
			chain := &nftables.Chain{Table: tableOf(ch.family), Name: ch.name}
			if d.op == opAttach {
				c.AddChain(chain)
			}
			// Flushed on attach too: a leftover chain of the same name must
			// not keep stale rules.
			c.FlushChain(chain)
			for _, r := range ch.rules {
				c.AddRule(&nftables.Rule{Table: chain.Table, Chain: chain, Exprs: r})
			}
		}
		if d.op == opUpdate {
			return nil
		}
		// An element that exists with another verdict (a ruleset that
		// drifted from the state) fails the batch: never overwritten.
		for _, add := range []struct {
			set   *nftables.Set
			key   []byte
			chain string
		}{{ports, ifnameKey(sb.Veth), "port_" + sb.ID}, {pre4, ip, "pre_" + sb.ID}, {fwd4, ip, "fwd_" + sb.ID}} {
			if err := c.SetAddElements(add.set, elem(add.key, add.chain)); err != nil {
				return errs.Wrap(errs.Internal, err, "nftables: element of %s", sb.ID)
			}
		}
	case opDetach:
		for _, del := range []struct {
			set *nftables.Set
			key []byte
		}{{ports, ifnameKey(sb.Veth)}, {pre4, ip}, {fwd4, ip}} {
			if err := c.SetDeleteElements(del.set, []nftables.SetElement{{Key: del.key}}); err != nil {
				return errs.Wrap(errs.Internal, err, "nftables: element of %s", sb.ID)
			}
		}
		for _, ch := range chains {
			c.DelChain(&nftables.Chain{Table: tableOf(ch.family), Name: ch.name})
		}
	}
	return nil
}

// exprChain is one of a sandbox's chains as expressions.
type exprChain struct {
	family, name string
	rules        [][]expr.Any
}

// sandboxExprs is sandboxChains (plan.go) compiled: the same chains, the
// same rules in the same order.
func sandboxExprs(cfg PlanConfig, sb SandboxNet) []exprChain {
	ip := sb.IP.AsSlice()
	gw := cfg.Gateway.AsSlice()
	accept, drop := &expr.Verdict{Kind: expr.VerdictAccept}, &expr.Verdict{Kind: expr.VerdictDrop}
	// bridge: ether type T, then the sender address at off in the network header.
	etherFrom := func(etherType uint16, off uint32) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(etherType)},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip},
			accept,
		}
	}
	port := exprChain{family: "bridge", name: "port_" + sb.ID, rules: [][]expr.Any{
		etherFrom(unix.ETH_P_ARP, 14), etherFrom(unix.ETH_P_IP, 12), {drop},
	}}

	ipv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
	daddr := func(p netip.Prefix) []expr.Any {
		return append(append([]expr.Any{}, ipv4...), prefixMatch(p)...)
	}
	l4 := func(proto byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}
	}
	thDport := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)},
		}
	}
	dnat := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: gw},
			&expr.Immediate{Register: 2, Data: be16(port)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		}
	}
	join := func(parts ...[]expr.Any) []expr.Any {
		var r []expr.Any
		for _, p := range parts {
			r = append(r, p...)
		}
		return r
	}
	p := sb.Policy
	var dnsMatch []expr.Any
	if p.Mode == egress.AllowAll {
		dnsMatch = daddr(netip.PrefixFrom(cfg.Gateway, 32))
	}
	pre := exprChain{family: "inet", name: "pre_" + sb.ID, rules: [][]expr.Any{
		join(dnsMatch, l4(unix.IPPROTO_UDP), thDport(53), dnat(cfg.DNSPort)),
		join(dnsMatch, l4(unix.IPPROTO_TCP), thDport(53), dnat(cfg.DNSPort)),
		join(l4(unix.IPPROTO_TCP), dnat(cfg.ProxyPort)),
	}}
	lookup := func(set string, invert bool) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set, Invert: invert},
		}
	}
	fwd := exprChain{family: "inet", name: "fwd_" + sb.ID, rules: [][]expr.Any{
		join(l4(unix.IPPROTO_TCP), []expr.Any{drop}),
		join(ipv4, lookup("blocked4", false), []expr.Any{drop}),
	}}
	rule := func(r egress.Rule, verdict expr.Any) {
		if _, ok := ipMatch(r); !ok {
			return
		}
		m := daddr(r.Prefix)
		if r.Port != 0 {
			m = append(m, thDport(r.Port)...)
		}
		fwd.rules = append(fwd.rules, append(m, verdict))
	}
	if p.Mode != egress.DenyAll {
		for _, r := range p.Deny {
			rule(r, drop)
		}
		private := join(ipv4, lookup("private4", false))
		if len(v4(cfg.OpenPrivate)) > 0 {
			private = join(private, lookup("openprivate4", true))
		}
		fwd.rules = append(fwd.rules, append(private, drop))
		for _, r := range p.Allow {
			rule(r, accept)
		}
		if p.Mode == egress.AllowAll {
			fwd.rules = append(fwd.rules, []expr.Any{accept})
		}
	}
	fwd.rules = append(fwd.rules, []expr.Any{drop})
	return []exprChain{port, pre, fwd}
}

// prefixMatch is `ip daddr P` as nft compiles it: a whole-byte prefix
// compares its bytes alone, any other is masked first.
func prefixMatch(p netip.Prefix) []expr.Any {
	p = p.Masked()
	a := p.Addr().AsSlice()
	bits := p.Bits()
	if bits%8 == 0 && bits > 0 {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: uint32(bits / 8)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:bits/8]},
		}
	}
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-bits))
	if bits == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a},
	}
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// ifnameKey is an interface name as an ifname set key (IFNAMSIZ bytes).
func ifnameKey(name string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, name)
	return k
}

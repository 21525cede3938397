package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// Links, addresses and routes are set in-process over netlink (no `ip`
// subprocess): on the host through netlink's package-level calls (each
// opens its socket in the calling thread's namespace), inside a sandbox's
// namespace the same calls on a locked OS thread moved there (inNetns). Only nftables goes through a subprocess: the
// whole ruleset (Plan) or a sandbox's delta, each a golden-tested script loaded in one transaction.

// run executes a command, feeding stdin, and classifies failures.
func run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		kind := errs.Internal
		if errors.Is(err, exec.ErrNotFound) {
			kind = errs.FailedPrecondition
		}
		return "", errs.Wrap(kind, err, "%s %s: %s", name, strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// nftApply loads a script in one transaction.
func nftApply(ctx context.Context, script string) error {
	_, err := run(ctx, script, "nft", "-f", "-")
	return err
}

// nlErr classifies a netlink failure: a missing privilege is the host's
// set-up, anything else is internal.
func nlErr(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	kind := errs.Internal
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		kind = errs.FailedPrecondition
	}
	return errs.Wrap(kind, err, "netlink: "+format, args...)
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// ifAddr is p as an interface address without a broadcast address, as
// `ip addr add` sets it (netlink would derive one unless told 0.0.0.0).
func ifAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Broadcast: net.IPv4zero}
}

func setupBridge(ctx context.Context, name string, gw netip.Prefix) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return errs.Wrap(errs.FailedPrecondition, err, "enable ip_forward")
	}
	br, err := netlink.LinkByName(name)
	if isLinkNotFound(err) {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nlErr(err, "add bridge %s", name)
		}
		br, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nlErr(err, "bridge %s", name)
	}
	// A bridge whose address was never set takes the lowest of its ports'
	// addresses, so attaching or detaching one sandbox (a delete, a pause,
	// a runsc rewind) could change the gateway's MAC under every other
	// sandbox, whose neighbour entries then point at nothing until they
	// expire (no gratuitous ARP): their DNS and proxy traffic is lost for
	// tens of seconds. A fixed address of its own keeps it.
	if mac := bridgeMAC(name); !bytes.Equal(br.Attrs().HardwareAddr, mac) || !addrSet(name) {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return nlErr(err, "set the address of %s", name)
		}
	}
	// The sandboxes are IPv4 only; no link-local IPv6 on the bridge either.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.AddrReplace(br, ifAddr(gw)); err != nil {
		return nlErr(err, "address %s on %s", gw, name)
	}
	// A bridge kept from a server with another subnet loses the old address
	// (the bridge is berth's own; nothing else puts addresses on it).
	if err := dropOtherAddrs(br, gw); err != nil {
		return err
	}
	return nlErr(netlink.LinkSetUp(br), "set %s up", name)
}

// bridgeMAC is the bridge's own address: locally administered, unicast,
// derived from its name so that it stays the same across daemon starts.
func bridgeMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte("berth bridge " + name))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// addrSet reports whether link name's address was set (NET_ADDR_SET), not
// inherited from its ports.
func addrSet(name string) bool {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "addr_assign_type"))
	return err == nil && strings.TrimSpace(string(b)) == "3"
}

// createNetns makes a persistent network namespace bind-mounted at path.
func createNetns(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "create netns file")
	}
	f.Close()
	if err := mountNewNetns(path); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// mountNewNetns creates a network namespace and bind-mounts it at path.
func mountNewNetns(path string) error {
	unshare := func() error {
		return errs.Wrap(errs.FailedPrecondition, unix.Unshare(unix.CLONE_NEWNET), "unshare a network namespace")
	}
	return onThreadIn(unshare, func() error {
		return errs.Wrap(errs.Internal, unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""),
			"bind-mount the network namespace at %s", path)
	})
}

// inNetns runs fn with its OS thread in the network namespace mounted at
// nsPath (see onThreadIn); netlink's package-level calls made by fn open
// their sockets there.
func inNetns(nsPath string, fn func() error) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open network namespace %s", nsPath)
	}
	defer ns.Close()
	return onThreadIn(func() error {
		return errs.Wrap(errs.Internal, netns.Set(ns), "enter network namespace %s", nsPath)
	}, fn)
}

// onThreadIn runs enter then fn on a locked OS thread of a goroutine of
// its own, and moves the thread back to the namespace it came from. A
// thread that cannot be moved back stays locked, so the runtime ends it
// with the goroutine instead of running other goroutines in a sandbox's
// namespace.
func onThreadIn(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- errs.Wrap(errs.Internal, err, "open the current network namespace")
			return
		}
		defer orig.Close()
		if err = enter(); err == nil {
			err = fn()
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, errs.Wrap(errs.Internal, serr, "return to the host network namespace"))
			return // the thread stays locked and ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// deleteNetns unmounts and removes a namespace file; missing is fine. The
// kernel frees the namespace (and the veth end inside) once nothing holds it.
func deleteNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return errs.Wrap(errs.Internal, err, "unmount %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errs.Wrap(errs.Internal, err, "remove %s", path)
	}
	return nil
}

// createVeth makes host-side veth on the bridge and "eth0" inside the namespace.
func createVeth(ctx context.Context, veth, nsPath, bridge string) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nlErr(err, "bridge %s", bridge)
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "open network namespace %s", nsPath)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth}, PeerName: "eth0",
		PeerHardwareAddr: sandboxMAC(veth), PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		return nlErr(err, "add veth %s", veth)
	}
	// A veth half set up (not isolated on the bridge) goes again at once.
	if err := vethOnBridge(veth, br); err != nil {
		return errors.Join(err, deleteLink(ctx, veth))
	}
	return nil
}

// sandboxMAC is the address of a sandbox's eth0: locally administered,
// unicast, derived from its veth's name (itself from the sandbox id), so a
// sandbox attached again after a memory pause or a rewind has the MAC it
// had. With a random one the host's neighbour entry for its address still
// named the old MAC after a runsc restore; the restored sandbox sends
// nothing by itself, so the entry stayed "reachable" and the host's dials
// to its ports went unanswered for tens of seconds (the E2B suite's runsc
// memory pause + connect timed out).
func sandboxMAC(veth string) net.HardwareAddr {
	h := sha256.Sum256([]byte("berth sandbox " + veth))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&0xfe | 0x02
	return mac
}

// forgetNeighbour removes the host's neighbour entry for ip on the bridge,
// if any. An address freed by one sandbox and taken by another (or by the
// same one in a fresh namespace) must be resolved again: an entry kept
// from before names a MAC nobody answers to any more, and Linux keeps
// using a "reachable" one for up to 45 s.
func forgetNeighbour(bridge string, ip netip.Addr) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nlErr(err, "bridge %s", bridge)
	}
	err = netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip.AsSlice()})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return nlErr(err, "forget the neighbour entry of %s on %s", ip, bridge)
	}
	return nil
}

// vethOnBridge makes veth an isolated port of br (sandboxes never talk to
// each other at layer 2) and sets it up.
func vethOnBridge(veth string, br netlink.Link) error {
	l, err := netlink.LinkByName(veth)
	if err != nil {
		return nlErr(err, "veth %s", veth)
	}
	if err := netlink.LinkSetMaster(l, br); err != nil {
		return nlErr(err, "put %s on %s", veth, br.Attrs().Name)
	}
	if err := netlink.LinkSetIsolated(l, true); err != nil {
		return nlErr(err, "isolate bridge port %s", veth)
	}
	return nlErr(netlink.LinkSetUp(l), "set %s up", veth)
}

func configureInside(ctx context.Context, nsPath string, addr netip.Prefix, gw netip.Addr) error {
	return inNetns(nsPath, func() error { return setInside(nsPath, addr, gw, false) })
}

// setInside sets lo and eth0 up with eth0's address and the default route;
// again tolerates the address and route being there already
// (reconfigureInside).
func setInside(nsPath string, addr netip.Prefix, gw netip.Addr, again bool) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nlErr(err, "lo in %s", nsPath)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return nlErr(err, "set lo up in %s", nsPath)
	}
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return nlErr(err, "eth0 in %s", nsPath)
	}
	if err := netlink.AddrAdd(eth0, ifAddr(addr)); err != nil && !(again && errors.Is(err, unix.EEXIST)) {
		return nlErr(err, "address %s on eth0 in %s", addr, nsPath)
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return nlErr(err, "set eth0 up in %s", nsPath)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil && !(again && errors.Is(err, unix.EEXIST)) {
		return nlErr(err, "default route via %s in %s", gw, nsPath)
	}
	return nil
}

// reconfigureInside gives an existing namespace's eth0 what
// configureInside gave it, whatever is left of that: IPv4 addresses other
// than addr are dropped, addr, the IPv6 link-local address and the default
// route are added where missing. The link is not set down and up to make
// the kernel do it: a veth set up again passes no traffic until the
// kernel's link watch runs (up to a second).
func reconfigureInside(ctx context.Context, nsPath string, addr netip.Prefix, gw netip.Addr) error {
	return inNetns(nsPath, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return nlErr(err, "eth0 in %s", nsPath)
		}
		if err := dropOtherAddrs(eth0, addr); err != nil {
			return err
		}
		if err := ensureLinkLocal(eth0); err != nil {
			return err
		}
		return setInside(nsPath, addr, gw, true)
	})
}

// ensureLinkLocal gives link the IPv6 link-local address the kernel made
// for it when it was set up (EUI-64 of its MAC, the default address
// generation mode) unless it has one: runsc takes it too.
func ensureLinkLocal(link netlink.Link) error {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return nlErr(err, "list IPv6 addresses of %s", link.Attrs().Name)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			return nil
		}
	}
	mac := link.Attrs().HardwareAddr
	if len(mac) != 6 {
		return nil
	}
	ip := net.IP{0xfe, 0x80, 0, 0, 0, 0, 0, 0, mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
	err = netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(64, 128)}})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nlErr(err, "link-local address %s on %s", ip, link.Attrs().Name)
	}
	return nil
}

// deleteLink removes a host link; a missing one is fine.
func deleteLink(ctx context.Context, name string) error {
	l, err := netlink.LinkByName(name)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return nlErr(err, "link %s", name)
	}
	if err := netlink.LinkDel(l); err != nil && !isLinkNotFound(err) {
		return nlErr(err, "delete link %s", name)
	}
	return nil
}

// deleteLinkIn removes a link inside the namespace at nsPath; a missing
// one is fine.
func deleteLinkIn(nsPath, name string) error {
	return inNetns(nsPath, func() error {
		return deleteLink(context.Background(), name)
	})
}

// hostLinks lists the host's links, retrying a dump that a concurrent
// change interrupted.
func hostLinks() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := netlink.LinkList()
		if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || i == 4 {
			return links, nlErr(err, "list links")
		}
	}
}

// listLinks returns the names of host links starting with prefix.
func listLinks(ctx context.Context, prefix string) ([]string, error) {
	links, err := hostLinks()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names, nil
}

// dropOtherAddrs removes every IPv4 address of link but keep.
func dropOtherAddrs(link netlink.Link, keep netip.Prefix) error {
	var addrs []netlink.Addr
	var err error
	for i := 0; i < 5; i++ {
		if addrs, err = netlink.AddrList(link, netlink.FAMILY_V4); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nlErr(err, "list addresses of %s", link.Attrs().Name)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		bits, _ := a.Mask.Size()
		if netip.PrefixFrom(ip.Unmap(), bits) == keep {
			continue
		}
		if err := netlink.AddrDel(link, &a); err != nil {
			return nlErr(err, "delete address %s of %s", a.IPNet, link.Attrs().Name)
		}
	}
	return nil
}

// linkMasters maps every host link's name to its master ("" for none).
func linkMasters(ctx context.Context) (map[string]string, error) {
	links, err := hostLinks()
	if err != nil {
		return nil, err
	}
	byIndex := make(map[int]string, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	m := make(map[string]string, len(links))
	for _, l := range links {
		m[l.Attrs().Name] = byIndex[l.Attrs().MasterIndex]
	}
	return m, nil
}

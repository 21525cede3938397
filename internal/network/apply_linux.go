package network

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

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

func setupBridge(ctx context.Context, name string, gw netip.Prefix) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return errs.Wrap(errs.FailedPrecondition, err, "enable ip_forward")
	}
	if _, err := run(ctx, "", "ip", "link", "show", "dev", name); err != nil {
		if _, err := run(ctx, "", "ip", "link", "add", "name", name, "type", "bridge"); err != nil {
			return err
		}
	}
	// The sandboxes are IPv4 only; no link-local IPv6 on the bridge either.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if _, err := run(ctx, "", "ip", "addr", "replace", gw.String(), "dev", name); err != nil {
		return err
	}
	// A bridge kept from a server with another subnet loses the old address
	// (the bridge is berth's own; nothing else puts addresses on it).
	if err := dropOtherAddrs(ctx, name, gw); err != nil {
		return err
	}
	_, err := run(ctx, "", "ip", "link", "set", "dev", name, "up")
	return err
}

// createNetns makes a persistent network namespace bind-mounted at path.
func createNetns(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "create netns file")
	}
	f.Close()
	if _, err := run(ctx, "", "unshare", "--net="+path, "true"); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
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
	if _, err := run(ctx, "", "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", nsPath); err != nil {
		return err
	}
	script := strings.Join([]string{
		"link set dev " + veth + " master " + bridge,
		"link set dev " + veth + " type bridge_slave isolated on",
		"link set dev " + veth + " up",
	}, "\n") + "\n"
	_, err := run(ctx, script, "ip", "-batch", "-")
	return err
}

func configureInside(ctx context.Context, nsPath string, addr netip.Prefix, gw netip.Addr) error {
	script := strings.Join([]string{
		"link set dev lo up",
		"addr add " + addr.String() + " dev eth0",
		"link set dev eth0 up",
		"route add default via " + gw.String() + " dev eth0",
	}, "\n") + "\n"
	_, err := run(ctx, script, "nsenter", "--net="+nsPath, "ip", "-batch", "-")
	return err
}

// deleteLink removes a link; a missing one is fine.
func deleteLink(ctx context.Context, name string) error {
	if _, err := run(ctx, "", "ip", "link", "show", "dev", name); err != nil {
		return nil
	}
	_, err := run(ctx, "", "ip", "link", "del", "dev", name)
	return err
}

// listLinks returns the names of host links starting with prefix.
func listLinks(ctx context.Context, prefix string) ([]string, error) {
	out, err := run(ctx, "", "ip", "-j", "link", "show")
	if err != nil {
		return nil, err
	}
	var links []struct {
		IfName string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "parse ip -j link")
	}
	var names []string
	for _, l := range links {
		if strings.HasPrefix(l.IfName, prefix) {
			names = append(names, l.IfName)
		}
	}
	return names, nil
}

// dropOtherAddrs removes every IPv4 address of link name but keep.
func dropOtherAddrs(ctx context.Context, name string, keep netip.Prefix) error {
	out, err := run(ctx, "", "ip", "-j", "-4", "addr", "show", "dev", name)
	if err != nil {
		return err
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return errs.Wrap(errs.Internal, err, "parse ip -j addr")
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			addr, err := netip.ParseAddr(a.Local)
			if err != nil || netip.PrefixFrom(addr, a.PrefixLen) == keep {
				continue
			}
			if _, err := run(ctx, "", "ip", "addr", "del", netip.PrefixFrom(addr, a.PrefixLen).String(), "dev", name); err != nil {
				return err
			}
		}
	}
	return nil
}

// linkMasters maps every host link's name to its master ("" for none).
func linkMasters(ctx context.Context) (map[string]string, error) {
	out, err := run(ctx, "", "ip", "-j", "link", "show")
	if err != nil {
		return nil, err
	}
	var links []struct {
		IfName string `json:"ifname"`
		Master string `json:"master"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "parse ip -j link")
	}
	m := make(map[string]string, len(links))
	for _, l := range links {
		m[l.IfName] = l.Master
	}
	return m, nil
}

package egress

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// resolver resolves names as the host does: the hosts file first, then the
// host's own resolver (Go's, reading /etc/resolv.conf and /etc/hosts).
type resolver struct {
	hostsFile string
	upstream  *net.Resolver

	mu      sync.Mutex
	modTime time.Time
	size    int64
	hosts   map[string][]netip.Addr
}

// newResolver reads hostsFile (default /etc/hosts) first, then asks
// upstream, or the host's resolvers when upstream is not set.
func newResolver(hostsFile string, upstream netip.AddrPort) *resolver {
	if hostsFile == "" {
		hostsFile = "/etc/hosts"
	}
	r := &net.Resolver{PreferGo: true}
	if upstream.IsValid() {
		r.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, upstream.String())
		}
	}
	return &resolver{hostsFile: hostsFile, upstream: r}
}

// errNoSuchHost marks a name that does not exist (NXDOMAIN).
var errNoSuchHost = errs.E(errs.NotFound, "no such host")

func (r *resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	name = normalizeHost(name)
	if name == "" {
		return nil, errNoSuchHost
	}
	if ips := r.fromHosts(name); len(ips) > 0 {
		return ips, nil
	}
	ips, err := r.upstream.LookupNetIP(ctx, "ip", name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, errNoSuchHost
		}
		return nil, errs.Wrap(errs.Unavailable, err, "resolve %s", name)
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips, nil
}

func (r *resolver) fromHosts(name string) []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, err := os.Stat(r.hostsFile); err == nil && (!st.ModTime().Equal(r.modTime) || st.Size() != r.size) {
		r.modTime, r.size = st.ModTime(), st.Size()
		r.hosts = parseHosts(r.hostsFile)
	}
	return append([]netip.Addr(nil), r.hosts[name]...)
}

func parseHosts(path string) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		ip, err := netip.ParseAddr(fields[0])
		if err != nil {
			continue
		}
		for _, n := range fields[1:] {
			n = normalizeHost(n)
			out[n] = append(out[n], ip.Unmap())
		}
	}
	return out
}

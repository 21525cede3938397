package bench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// HTTPSUpstream is the TLS service the effects-https row's sandboxes talk
// to: a Go HTTPS server answering every request after Delay, in a network
// namespace of its own reached over a veth (the egress proxy refuses the
// host's own addresses), at an address of the benchmarking range
// 198.18.0.0/15. The server the bench starts resolves Host through
// HostsFile and trusts CAFile (`--egress-hosts`, `--upstream-ca`).
type HTTPSUpstream struct {
	Host, CAFile, HostsFile string
	Delay                   time.Duration
	Requests                atomic.Int64 // requests answered

	dir, ns, veth string
	srv           *http.Server
	wg            sync.WaitGroup
}

// upstreamHost is the name the sandboxes use; it resolves only through
// the hosts file the bench hands the server.
const upstreamHost = "effects.bench.invalid"

// StartHTTPSUpstream creates the namespace, the veth and the server.
func StartHTTPSUpstream(delay time.Duration) (_ *HTTPSUpstream, err error) {
	dir, err := os.MkdirTemp("", "berth-bench-up-")
	if err != nil {
		return nil, err
	}
	u := &HTTPSUpstream{Host: upstreamHost, Delay: delay, dir: dir, ns: filepath.Join(dir, "net")}
	defer func() {
		if err != nil {
			u.Close()
		}
	}()
	prefix, err := freePrefix()
	if err != nil {
		return nil, err
	}
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	u.veth = "beb" + hex.EncodeToString(rb[:])
	if err := os.WriteFile(u.ns, nil, 0o600); err != nil {
		return nil, err
	}
	steps := [][]string{{"unshare", "--net=" + u.ns, "true"},
		{"ip", "link", "add", u.veth, "type", "veth", "peer", "name", "eth0", "netns", u.ns},
		{"ip", "addr", "add", prefix + ".1/24", "dev", u.veth}, {"ip", "link", "set", u.veth, "up"}}
	for _, c := range []string{"link set lo up", "addr add " + prefix + ".10/24 dev eth0", "link set eth0 up", "route add default via " + prefix + ".1"} {
		steps = append(steps, append([]string{"nsenter", "--net=" + u.ns, "ip"}, strings.Fields(c)...))
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("upstream network: %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	u.HostsFile = filepath.Join(dir, "hosts")
	if err := os.WriteFile(u.HostsFile, []byte(prefix+".10 "+upstreamHost+"\n"), 0o644); err != nil {
		return nil, err
	}
	cert, err := u.makeCert()
	if err != nil {
		return nil, err
	}
	ln, err := listenIn(u.ns, "tcp4", ":443")
	if err != nil {
		return nil, err
	}
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	u.wg.Go(func() { _ = u.srv.ServeTLS(ln, "", "") })
	return u, nil
}

// serve answers like a payment API: the body read, Delay, a small JSON.
func (u *HTTPSUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	time.Sleep(u.Delay)
	u.Requests.Add(1)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
}

// makeCert writes a self-signed certificate for Host to CAFile.
func (u *HTTPSUpstream) makeCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth bench upstream"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{upstreamHost}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	u.CAFile = filepath.Join(u.dir, "ca.pem")
	if err := os.WriteFile(u.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Close stops the server and removes the veth and the namespace.
func (u *HTTPSUpstream) Close() {
	if u.srv != nil {
		_ = u.srv.Close()
		u.wg.Wait()
	}
	if u.veth != "" {
		_ = exec.Command("ip", "link", "del", "dev", u.veth).Run()
	}
	_ = unix.Unmount(u.ns, unix.MNT_DETACH)
	_ = os.RemoveAll(u.dir)
}

// freePrefix picks a /24 of 198.18.0.0/15 no interface of the host uses.
func freePrefix() (string, error) {
	addrs, _ := net.InterfaceAddrs()
	for range 64 {
		var b [2]byte
		_, _ = rand.Read(b[:])
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + b[0]%2, b[1], 0}), 24)
		used := false
		for _, a := range addrs {
			if q, err := netip.ParsePrefix(a.String()); err == nil && q.Overlaps(p) {
				used = true
			}
		}
		if !used {
			return fmt.Sprintf("198.%d.%d", 18+b[0]%2, b[1]), nil
		}
	}
	return "", errors.New("upstream network: no free /24 in 198.18.0.0/15")
}

// listenIn opens a listener inside the network namespace at nsPath: the
// socket keeps its namespace after the thread returns to the host's. It
// runs on a goroutine of its own, locked to its thread: a thread that
// could not switch back is never unlocked, so the runtime discards it.
func listenIn(nsPath, network, addr string) (net.Listener, error) {
	type res struct {
		ln  net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: err}
			return
		}
		defer self.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: fmt.Errorf("setns %s: %w", nsPath, err)}
			return
		}
		ln, err := net.Listen(network, addr)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- res{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
)

// handle decides one redirected sandbox connection and proxies it.
func (p *Proxy) handle(ctx context.Context, c *net.TCPConn) {
	start := time.Now()
	src := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
	st, pol, ok := p.snapshot(src)
	if !ok {
		_ = c.SetLinger(0)
		c.Close()
		return
	}
	if !p.acquireConn(st) {
		p.limitHit(st, "tcp", "connections", p.cfg.MaxConns)
		_ = c.SetLinger(0)
		c.Close()
		return
	}
	defer p.releaseConn(st)
	dst, err := originalDst(c)
	if err != nil {
		p.log.Warn("egress original destination", "sandbox_id", st.id, "err", err)
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	isTLS, isHTTP, host, head := peek(c)
	_ = c.SetReadDeadline(time.Time{})

	q := Query{IP: dst.Addr(), Port: dst.Port(), Host: host}
	v := Decide(pol, q)
	d := Decision{Time: start, SandboxID: st.id, Proto: "tcp", DstIP: q.IP, DstPort: q.Port,
		Host: normalizeHost(host), Rule: v.Rule, Verdict: "deny"}
	deny := func(reason string) {
		d.Verdict, d.Reason, d.Duration = "deny", reason, time.Since(start)
		_ = c.SetLinger(0)
		c.Close()
		p.emit(d)
	}
	if !v.Allow {
		deny("")
		return
	}
	grants := []Grant(nil)
	if isTLS && d.Host != "" {
		grants = p.grantsFor(st, d.Host)
	}
	// An effectful host is intercepted so its requests can be recorded
	// (needs the CA and a ledger; plain HTTP is relayed per request anyway).
	effectful := isTLS && p.cfg.CA != nil && p.ledgerOf() != nil && pol.Effects.Effectful(d.Host, q.Port)
	var up *net.TCPConn
	if d.Host != "" && (v.ByName || len(grants) > 0 || effectful) {
		// Never trust the sandbox's choice of IP for a name-based decision.
		up, err = p.dialName(ctx, pol, d.Host, q.Port)
	} else if !p.dialable(pol, q.IP, q.Port) {
		deny("blocked-address")
		return
	} else {
		up, err = p.dialAddr(ctx, netip.AddrPortFrom(q.IP, q.Port))
	}
	if err != nil {
		reason := "dial-failed"
		if errs.Is(err, errs.PermissionDenied) {
			reason = "private-address"
		}
		p.log.Debug("egress dial", "sandbox_id", st.id, "host", d.Host, "err", err)
		deny(reason)
		return
	}
	upIP := netip.MustParseAddrPort(up.RemoteAddr().String()).Addr().Unmap()
	var once sync.Once
	closeBoth := func(reset bool) {
		once.Do(func() {
			if reset {
				_ = c.SetLinger(0)
			}
			c.Close()
			up.Close()
		})
	}
	// Revocation resets the sandbox's side; a normal end closes gracefully
	// so no unsent tail is discarded.
	ac := &activeConn{q: q, upIP: upIP, closer: func() { closeBoth(true) }}
	if !p.track(st, ac) {
		closeBoth(true)
		deny("policy-changed")
		return
	}
	defer p.untrack(st, ac)
	defer closeBoth(false)

	d.Verdict = "allow"
	if len(grants) > 0 || effectful {
		d.Intercepted = true
		d.BytesOut, d.BytesIn, err = p.intercept(ctx, st, d.Host, q.Port, &prefixConn{head: head, Conn: c}, up)
		if err != nil {
			d.Reason = "intercept: " + err.Error()
		}
	} else if isHTTP {
		// Plain HTTP is relayed request by request, each one checked: a
		// keep-alive connection opened for an allowed Host must not carry
		// a request for another.
		d.BytesOut, d.BytesIn, err = p.relayHTTP(st, q, d.Host, &prefixConn{head: head, Conn: c}, up)
		if err != nil {
			d.Reason = err.Error()
		}
	} else {
		d.BytesOut, d.BytesIn = splice(c, head, up)
	}
	d.Duration = time.Since(start)
	p.emit(d)
}

// errHostChanged ends a connection whose request names another host than
// the one it was opened (and decided) for.
var errHostChanged = errs.E(errs.PermissionDenied, "host-changed")

// requestHost is a request's Host without the port, normalized.
func requestHost(r *http.Request) string {
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return normalizeHost(h)
}

// canonicalHost is the checked name rh with the port of the Host header
// raw, if it has a valid one.
func canonicalHost(raw, rh string) string {
	if _, port, err := net.SplitHostPort(raw); err == nil && rh != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err == nil && n > 0 {
			return net.JoinHostPort(rh, strconv.FormatUint(n, 10))
		}
	}
	return rh
}

// originForm checks a request's target and rewrites it to origin form
// (path and query; the Host header names the host), so the upstream parses
// the same target the policy was checked against. CONNECT, opaque and
// non-HTTP absolute targets are refused: an upstream may read them as
// another host than the one decided on.
func originForm(r *http.Request) bool {
	u := r.URL
	if r.Method == http.MethodConnect || u == nil || u.Opaque != "" || u.User != nil {
		return false
	}
	switch strings.ToLower(u.Scheme) {
	case "", "http", "https":
	default:
		return false
	}
	u.Scheme, u.Host = "", ""
	return true
}

// refuseRequest answers a request the policy refuses and logs the denial.
func (p *Proxy) refuseRequest(w io.Writer, st *sandboxState, q Query, host, rule, reason string) {
	writeStatus(w, http.StatusForbidden, "berth egress: request for "+strconv.Quote(host)+" refused on this connection")
	p.emit(Decision{SandboxID: st.id, Proto: "tcp", DstIP: q.IP, DstPort: q.Port, Host: host, Rule: rule,
		Verdict: "deny", Reason: reason})
}

// relayHTTP relays HTTP/1.x requests from the sandbox to up one at a time.
// Every request must name host (the one the connection was decided for)
// and still be allowed by the sandbox's current policy; the first that is
// not gets a 403 and ends the connection. A protocol upgrade (101) is
// spliced from then on.
func (p *Proxy) relayHTTP(st *sandboxState, q Query, host string, client net.Conn, up *net.TCPConn) (out, in int64, err error) {
	cc := &countingConn{Conn: client}
	uc := &countingConn{Conn: up}
	defer func() { out, in = uc.written.Load(), cc.written.Load() }()
	lim := &headLimit{r: client}
	br := bufio.NewReader(lim)
	ubr := bufio.NewReader(up)
	for {
		lim.n = maxRequestHead
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, 0, nil
			}
			return 0, 0, err
		}
		lim.n = -1
		if !originForm(req) {
			p.refuseRequest(cc, st, q, requestHost(req), "bad-request-target", "request target "+strconv.Quote(req.RequestURI)+" not relayed")
			return 0, 0, errHostChanged
		}
		rh := requestHost(req)
		_, pol, ok := p.snapshot(st.ip)
		if !ok {
			return 0, 0, nil
		}
		if v := Decide(pol, Query{IP: q.IP, Port: q.Port, Host: rh}); !v.Allow {
			p.refuseRequest(cc, st, q, rh, v.Rule, "request refused on a kept-alive connection")
			return 0, 0, errHostChanged
		}
		if rh != host {
			p.refuseRequest(cc, st, q, rh, "host-changed", "connection opened for "+strconv.Quote(host))
			return 0, 0, errHostChanged
		}
		// The upstream gets the Host that was checked, in canonical form
		// (Go would send an invalid one as empty: another virtual host).
		req.Host = canonicalHost(req.Host, rh)
		if led := p.ledgerOf(); led != nil && recordable(pol.Effects, rh, q.Port, req.Method, false) {
			in := Intent{SandboxID: st.id, Host: rh, Port: q.Port, Policy: pol.Effects}
			end, err := p.relayEffect(context.Background(), led, in, req, cc, uc, ubr, func() error { return nil }) // plain HTTP: dialled already
			if err != nil {
				return 0, 0, err
			}
			if end {
				drainBeforeClose(client)
				return 0, 0, nil
			}
			continue
		}
		if err := req.Write(uc); err != nil {
			return 0, 0, err
		}
		for {
			resp, err := http.ReadResponse(ubr, req)
			if err != nil {
				return 0, 0, err
			}
			if resp.StatusCode == http.StatusSwitchingProtocols {
				if err := resp.Write(cc); err != nil {
					return 0, 0, err
				}
				// The bytes already buffered on either side go first.
				var wg sync.WaitGroup
				wg.Go(func() {
					_, _ = io.Copy(uc, br)
					_ = up.CloseWrite()
				})
				_, _ = io.Copy(cc, ubr)
				if tc, ok := client.(interface{ CloseWrite() error }); ok {
					_ = tc.CloseWrite()
				}
				wg.Wait()
				return 0, 0, nil
			}
			err = resp.Write(cc)
			resp.Body.Close()
			if err != nil {
				return 0, 0, err
			}
			if resp.StatusCode >= 200 {
				if req.Close || resp.Close {
					return 0, 0, nil
				}
				break
			}
			// 1xx (100 Continue, 103 Early Hints): the final answer follows.
		}
	}
}

// maxRequestHead bounds a request line and headers read from a sandbox.
const maxRequestHead = 64 << 10

// headLimit bounds what a bufio.Reader above it may read while a request
// head is parsed (n >= 0); n < 0 lifts the bound for the body.
type headLimit struct {
	r io.Reader
	n int64
}

func (l *headLimit) Read(b []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(b)
	}
	if l.n == 0 {
		return 0, errs.E(errs.ResourceExhausted, "request head larger than %d bytes", maxRequestHead)
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

func (p *Proxy) dialAddr(ctx context.Context, ap netip.AddrPort) (*net.TCPConn, error) {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", ap.String())
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "dial %s", ap)
	}
	return c.(*net.TCPConn), nil
}

// dialName resolves host on the host and dials the first permitted address.
func (p *Proxy) dialName(ctx context.Context, pol Policy, host string, port uint16) (*net.TCPConn, error) {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	ips, err := p.res.lookup(rctx, host)
	cancel()
	if err != nil {
		return nil, err
	}
	var lastErr error = errs.E(errs.PermissionDenied, "%s resolves only to addresses the policy does not permit", host)
	for _, ip := range ips {
		if !ip.Is4() || !p.dialable(pol, ip, port) {
			continue
		}
		c, err := p.dialAddr(ctx, netip.AddrPortFrom(ip, port))
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// splice copies both ways until both sides are done; TCP to TCP uses
// splice(2) after the peeked head is written.
func splice(c *net.TCPConn, head []byte, up *net.TCPConn) (out, in int64) {
	var wg sync.WaitGroup
	wg.Go(func() {
		n, err := up.Write(head)
		out = int64(n)
		if err == nil {
			m, _ := up.ReadFrom(c)
			out += m
		}
		_ = up.CloseWrite()
	})
	in, _ = c.ReadFrom(up)
	_ = c.CloseWrite()
	wg.Wait()
	return out, in
}

// peek reads the start of a connection: a TLS ClientHello (for SNI) or an
// HTTP request head (for Host; isHTTP when one was parsed). It returns
// everything it read, to replay.
func peek(c net.Conn) (isTLS, isHTTP bool, host string, head []byte) {
	rec := &recordingConn{Conn: c, limit: 64 << 10}
	var first [1]byte
	if _, err := io.ReadFull(rec, first[:]); err != nil {
		return false, false, "", rec.buf.Bytes()
	}
	if first[0] == 0x16 { // TLS handshake record
		var sni string
		errDone := errors.New("done")
		srv := tls.Server(&prefixConn{head: first[:], Conn: rec}, &tls.Config{
			GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				sni = h.ServerName
				return nil, errDone
			},
		})
		_ = srv.Handshake()
		return true, false, sni, rec.buf.Bytes()
	}
	req, err := http.ReadRequest(bufio.NewReader(&prefixConn{head: first[:], Conn: rec}))
	if err == nil {
		isHTTP = true
		host = req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if strings.ContainsAny(host, " \t\r\n/\\@?#") {
			host = "" // no host name: decided as a request without one
		}
	}
	return false, isHTTP, host, rec.buf.Bytes()
}

// recordingConn keeps what is read and discards writes (so a failed peek
// handshake cannot send an alert to the sandbox).
type recordingConn struct {
	net.Conn
	buf   bytes.Buffer
	limit int
}

func (r *recordingConn) Read(b []byte) (int, error) {
	if r.buf.Len() >= r.limit {
		return 0, io.EOF
	}
	if len(b) > r.limit-r.buf.Len() {
		b = b[:r.limit-r.buf.Len()]
	}
	n, err := r.Conn.Read(b)
	r.buf.Write(b[:n])
	return n, err
}

func (r *recordingConn) Write(b []byte) (int, error) { return len(b), nil }

// prefixConn replays head before reading from Conn.
type prefixConn struct {
	head []byte
	net.Conn
}

// CloseWrite half-closes the underlying connection where it can.
func (p *prefixConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// originalDst is the destination the sandbox dialled before nftables
// redirected it (SO_ORIGINAL_DST from conntrack).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		// struct sockaddr_in: family, port (big endian), address.
		port := uint16(m.Multiaddr[2])<<8 | uint16(m.Multiaddr[3])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, errs.Wrap(errs.Internal, err, "SO_ORIGINAL_DST")
	}
	return ap, nil
}

func hostPort(host string, port uint16) string {
	if port == 443 {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// injectGrants sets the header of each grant DecideGrants lets through, and
// only that: the placeholder is never replaced in the path, the query or
// other headers, where a server could echo the real value back to the
// sandbox (secret reflection). A refused grant is logged (lease_revoked,
// lease_frozen) and the request goes on without it. It returns the grants
// it injected.
func injectGrants(req *http.Request, grants []Grant) []Grant {
	target := req.RequestURI
	if target == "" && req.URL != nil {
		target = req.URL.String()
	}
	inject, refused := DecideGrants(time.Now(), grants, target, req.Header)
	for _, r := range refused {
		if r.Grant.refuse != nil {
			r.Grant.refuse(r.Verdict, r.Reason)
		}
	}
	for _, g := range inject {
		name, value := g.header()
		req.Header.Set(name, value)
	}
	return inject
}

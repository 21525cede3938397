package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// intercept terminates the sandbox's TLS with a certificate from berth's CA,
// opens verified TLS to the real host, and relays HTTP/1.1 requests one by
// one, injecting the sandbox's grants for host into each; side effects
// (effects.go) go through the ledger.
func (p *Proxy) intercept(ctx context.Context, st *sandboxState, host string, port uint16, client net.Conn, up net.Conn) (out, in int64, err error) {
	cc := &countingConn{Conn: client}
	uc := &countingConn{Conn: up}
	defer func() { out, in = uc.written.Load(), cc.written.Load() }()

	leaf, err := p.cfg.CA.Certificate(host)
	if err != nil {
		return 0, 0, err
	}
	hsCtx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	down := tls.Server(cc, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	// The upstream's handshake runs alongside the sandbox's, the reading of
	// the first request and, for a recorded one, its intent's commit:
	// ready() waits for it before a request's first byte is written
	// upstream (so "recorded before sent" holds: the write follows both).
	upTLS := tls.Client(uc, p.upstreamTLS(host))
	upHS := make(chan error, 1)
	go func() { upHS <- upTLS.HandshakeContext(hsCtx) }()
	var upErr error
	upWaited := false
	ready := func() error {
		if !upWaited {
			upErr, upWaited = <-upHS, true
			if upErr != nil {
				// The sandbox sees a 502 rather than a silently broken stream.
				writeStatus(down, http.StatusBadGateway, "berth egress: upstream TLS to "+host+" failed")
			}
		}
		return upErr
	}
	defer func() {
		cancel() // aborts a handshake still under way; joined before returning
		if !upWaited {
			<-upHS
		}
	}()
	if err := down.HandshakeContext(hsCtx); err != nil {
		return 0, 0, err
	}
	lim := &headLimit{r: down}
	br := bufio.NewReader(lim)
	ubr := bufio.NewReader(upTLS)
	for {
		lim.n = maxRequestHead
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return 0, 0, nil
			}
			return 0, 0, err
		}
		lim.n = -1
		if !originForm(req) {
			p.refuseRequest(down, st, Query{Port: port, Host: host}, requestHost(req), "bad-request-target", "request target "+strconv.Quote(req.RequestURI)+" not relayed")
			return 0, 0, errHostChanged
		}
		if rh := requestHost(req); rh != "" && rh != host {
			// Domain fronting: the TLS name is allowed (and carries the
			// grant), the Host inside names another.
			p.refuseRequest(down, st, Query{Port: port, Host: host}, rh, "host-mismatch", "Host differs from TLS SNI "+strconv.Quote(host))
			return 0, 0, errHostChanged
		}
		req.Host = hostPort(host, port)
		injected := injectGrants(req, p.grantsFor(st, host)) // only an active lease's secret goes out
		if led := p.ledgerOf(); led != nil {
			if _, pol, ok := p.snapshot(st.ip); ok && recordable(pol.Effects, host, port, req.Method, len(injected) > 0) {
				in := Intent{SandboxID: st.id, Host: host, Port: port, Secret: len(injected) > 0, Policy: pol.Effects}
				end, err := p.relayEffect(ctx, led, in, req, down, upTLS, ubr, ready)
				if err != nil {
					return 0, 0, err
				}
				if end {
					_ = down.CloseWrite()
					drainBeforeClose(client)
					return 0, 0, nil
				}
				continue
			}
		}
		if err := ready(); err != nil {
			return 0, 0, err
		}
		if err := req.Write(upTLS); err != nil {
			return 0, 0, err
		}
		resp, err := http.ReadResponse(ubr, req)
		if err != nil {
			return 0, 0, err
		}
		err = resp.Write(down)
		resp.Body.Close()
		if err != nil {
			return 0, 0, err
		}
		if req.Close || resp.Close {
			_ = down.CloseWrite()
			return 0, 0, nil
		}
	}
}

// A refused request's body may still be on its way when the answer is
// written: closing a socket with unread bytes sends a RST, which can reach
// the client before it has read the answer ("connection reset" instead of
// 413). So the connection is half-closed and what the client still sends is
// read and dropped, bounded in bytes and time (the client is hostile).
const (
	lingerBytes = 32 << 20
	lingerTime  = 2 * time.Second
)

func drainBeforeClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, c, lingerBytes)
}

func writeStatus(w io.Writer, code int, msg string) {
	resp := &http.Response{StatusCode: code, ProtoMajor: 1, ProtoMinor: 1, Close: true,
		Header: http.Header{"Content-Type": {"text/plain"}}, ContentLength: int64(len(msg) + 1),
		Body: io.NopCloser(strings.NewReader(msg + "\n"))}
	_ = resp.Write(w)
}

type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

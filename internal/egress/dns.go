package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/berth-dev/berth/internal/errs"
)

// The resolver's codec is golang.org/x/net/dns/dnsmessage: it bounds names
// (255 bytes, no dots inside a label, at most 10 compression pointers) and
// every section it is asked to read.

const dnsTTL = 30

// dnsQuestion is the single question of a query and the header it came with.
type dnsQuestion struct {
	hdr  dnsmessage.Header
	q    dnsmessage.Question // as sent: the answer echoes it, case included
	name string              // lower case, without the trailing dot
}

// parseDNSQuery reads the header and the one question of a query; what
// follows the question (an EDNS OPT record, trailing bytes) is ignored.
func parseDNSQuery(b []byte) (dnsQuestion, error) {
	var q dnsQuestion
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil {
		return q, errs.Wrap(errs.InvalidArgument, err, "dns: short header")
	}
	q.hdr = h
	if h.Response {
		return q, errs.E(errs.InvalidArgument, "dns: want a query")
	}
	if q.q, err = p.Question(); err != nil {
		return q, errs.Wrap(errs.InvalidArgument, err, "dns: want one question")
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return q, errs.E(errs.InvalidArgument, "dns: want one question")
	}
	q.name = strings.ToLower(strings.TrimSuffix(q.q.Name.String(), "."))
	return q, nil
}

// dnsResponse answers q with rcode and A records for ips; withQuestion
// false leaves the question out (an answer to a query that had none
// readable).
func dnsResponse(q dnsQuestion, withQuestion bool, rcode dnsmessage.RCode, ips []netip.Addr) []byte {
	h := dnsmessage.Header{ID: q.hdr.ID, Response: true, OpCode: q.hdr.OpCode,
		RecursionDesired: q.hdr.RecursionDesired, RecursionAvailable: true, RCode: rcode}
	b := dnsmessage.NewBuilder(make([]byte, 0, 64+len(ips)*16), h)
	b.EnableCompression() // every answer points at the question's name
	if withQuestion {
		if err := b.StartQuestions(); err != nil {
			return headerOnly(h)
		}
		if err := b.Question(q.q); err != nil {
			return headerOnly(h)
		}
	}
	if len(ips) > 0 {
		if err := b.StartAnswers(); err != nil {
			return headerOnly(h)
		}
		rh := dnsmessage.ResourceHeader{Name: q.q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: dnsTTL}
		for _, ip := range ips {
			if err := b.AResource(rh, dnsmessage.AResource{A: ip.As4()}); err != nil {
				return headerOnly(h)
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return headerOnly(h)
	}
	return out
}

// headerOnly is a reply of just h (no sections), for a message the
// builder refuses: SERVFAIL unless h already says what went wrong.
func headerOnly(h dnsmessage.Header) []byte {
	if h.RCode == dnsmessage.RCodeSuccess {
		h.RCode = dnsmessage.RCodeServerFailure
	}
	bld := dnsmessage.NewBuilder(make([]byte, 0, 12), h)
	out, err := bld.Finish()
	if err != nil { // a header alone always packs
		panic(err)
	}
	return out
}

// answerDNS builds the reply for one query from src; nil means drop.
func (p *Proxy) answerDNS(ctx context.Context, src netip.Addr, msg []byte) []byte {
	st, pol, ok := p.snapshot(src)
	if !ok {
		return nil
	}
	q, err := parseDNSQuery(msg)
	if err != nil {
		if len(msg) < 12 {
			return nil // not even a header: nothing to answer
		}
		// The header only: its ID, whatever else it claims.
		return dnsResponse(dnsQuestion{hdr: dnsmessage.Header{ID: q.hdr.ID}}, false, dnsmessage.RCodeFormatError, nil)
	}
	if q.hdr.OpCode != 0 {
		return dnsResponse(q, true, dnsmessage.RCodeNotImplemented, nil)
	}
	d := Decision{SandboxID: st.id, Proto: "dns", Host: q.name, DstPort: 53}
	allowedName, denied := pol.nameAllowed(q.name)
	if denied {
		d.Verdict, d.Rule = "deny", "name-denied"
		p.emit(d)
		return dnsResponse(q, true, dnsmessage.RCodeNameError, nil)
	}
	if !allowedName {
		// No hostname rule allows it: refuse without asking upstream, so
		// that the name itself (a classic exfiltration channel) never
		// leaves the host. CIDR rules are for addresses, not for names.
		d.Verdict, d.Rule = "deny", "default-deny"
		p.emit(d)
		return dnsResponse(q, true, dnsmessage.RCodeRefused, nil)
	}
	if q.q.Class != dnsmessage.ClassINET || q.q.Type != dnsmessage.TypeA {
		// The sandbox has IPv4 only; other types (TXT, MX, ...) would only
		// widen the channel a policy is meant to close.
		return dnsResponse(q, true, dnsmessage.RCodeSuccess, nil)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ips, err := p.res.lookup(rctx, q.name)
	cancel()
	if errors.Is(err, errNoSuchHost) {
		return dnsResponse(q, true, dnsmessage.RCodeNameError, nil)
	}
	if err != nil {
		return dnsResponse(q, true, dnsmessage.RCodeServerFailure, nil)
	}
	var keep []netip.Addr
	for _, ip := range ips {
		if !ip.Is4() {
			continue
		}
		if p.dialable(pol, ip, 0) {
			keep = append(keep, ip)
		} else {
			d.DstIP = ip
		}
	}
	if len(keep) == 0 && d.DstIP.IsValid() {
		// A name that resolves into the operator's network (or loopback,
		// the host, the sandbox subnet) is refused: DNS rebinding guard.
		d.Verdict, d.Rule, d.Reason = "deny", "dns-rebinding", "answer in a private or blocked range"
		p.emit(d)
		return dnsResponse(q, true, dnsmessage.RCodeRefused, nil)
	}
	d.Verdict, d.Rule = "allow", "dns"
	if len(keep) > 0 {
		d.DstIP = keep[0]
	}
	p.emit(d)
	return dnsResponse(q, true, dnsmessage.RCodeSuccess, keep)
}

// admitDNS applies src's per-sandbox DNS caps; release must be called
// when the query is answered. ok=false means drop (the client retries).
func (p *Proxy) admitDNS(src netip.Addr) (release func(), ok bool) {
	st, _, known := p.snapshot(src)
	if !known {
		return func() {}, true // answerDNS drops it
	}
	ok, limit, max := p.acquireDNS(st, time.Now())
	if !ok {
		p.limitHit(st, "dns", limit, max)
		return nil, false
	}
	return func() { p.releaseDNS(st) }, true
}

func (p *Proxy) serveDNSUDP(ctx context.Context, pc *net.UDPConn, wg *sync.WaitGroup) {
	// The global bound; per-sandbox caps (admitDNS) keep one sandbox from
	// taking all of it.
	sem := make(chan struct{}, 512)
	for {
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		release, ok := p.admitDNS(from.Addr())
		if !ok {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			release()
			continue // overloaded: drop, the client retries
		}
		wg.Go(func() {
			defer func() { <-sem; release() }()
			if resp := p.answerDNS(ctx, from.Addr(), buf[:n]); resp != nil {
				if len(resp) > 512 {
					resp = truncate(resp)
				}
				_, _ = pc.WriteToUDPAddrPort(resp, from)
			}
		})
	}
}

// truncate keeps the header and question of a reply, drops its records
// and sets TC (the client retries over TCP).
func truncate(resp []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return resp
	}
	h.Truncated = true
	qs, err := p.AllQuestions()
	b := dnsmessage.NewBuilder(make([]byte, 0, len(resp)), h)
	b.EnableCompression()
	if err == nil && b.StartQuestions() == nil {
		for _, q := range qs {
			if b.Question(q) != nil {
				return headerOnly(h)
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return headerOnly(h)
	}
	return out
}

func (p *Proxy) serveDNSTCP(ctx context.Context, ln *net.TCPListener, wg *sync.WaitGroup) {
	var mu sync.Mutex
	open := map[net.Conn]struct{}{}
	defer func() {
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		src := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
		st, _, known := p.snapshot(src)
		if !known {
			c.Close()
			continue
		}
		if !p.acquireConn(st) {
			p.limitHit(st, "dns", "connections", p.cfg.MaxConns)
			c.Close()
			continue
		}
		mu.Lock()
		open[c] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(open, c)
				mu.Unlock()
				c.Close()
				p.releaseConn(st)
			}()
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				msg := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				release, ok := p.admitDNS(src)
				if !ok {
					return
				}
				resp := p.answerDNS(ctx, src, msg)
				release()
				if resp == nil {
					return
				}
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...)); err != nil {
					return
				}
			}
		})
	}
}

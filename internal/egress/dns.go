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

	"github.com/berth-dev/berth/internal/errs"
)

// DNS wire constants (RFC 1035).
const (
	dnsTypeA    = 1
	dnsTypeAAAA = 28
	dnsClassIN  = 1

	rcodeOK       = 0
	rcodeFormErr  = 1
	rcodeServFail = 2
	rcodeNXDomain = 3
	rcodeNotImp   = 4
	rcodeRefused  = 5

	dnsTTL = 30
)

// dnsQuestion is the single question of a query.
type dnsQuestion struct {
	id     uint16
	flags  uint16
	name   string
	qtype  uint16
	qclass uint16
	end    int // offset just past the question
}

func parseDNSQuery(b []byte) (dnsQuestion, error) {
	var q dnsQuestion
	if len(b) < 12 {
		return q, errs.E(errs.InvalidArgument, "dns: short header")
	}
	q.id = binary.BigEndian.Uint16(b[0:])
	q.flags = binary.BigEndian.Uint16(b[2:])
	if q.flags&0x8000 != 0 || binary.BigEndian.Uint16(b[4:]) != 1 {
		return q, errs.E(errs.InvalidArgument, "dns: want one question")
	}
	var labels []string
	i := 12
	for {
		if i >= len(b) {
			return q, errs.E(errs.InvalidArgument, "dns: truncated name")
		}
		l := int(b[i])
		i++
		if l == 0 {
			break
		}
		if l > 63 || i+l > len(b) {
			return q, errs.E(errs.InvalidArgument, "dns: bad label") // compression is not used in questions
		}
		labels = append(labels, string(b[i:i+l]))
		i += l
	}
	if i+4 > len(b) {
		return q, errs.E(errs.InvalidArgument, "dns: truncated question")
	}
	q.name = strings.ToLower(strings.Join(labels, "."))
	q.qtype = binary.BigEndian.Uint16(b[i:])
	q.qclass = binary.BigEndian.Uint16(b[i+2:])
	q.end = i + 4
	return q, nil
}

// dnsResponse answers q (whose wire form is query) with A records.
func dnsResponse(query []byte, q dnsQuestion, rcode int, ips []netip.Addr) []byte {
	out := make([]byte, 12, q.end+len(ips)*16)
	binary.BigEndian.PutUint16(out[0:], q.id)
	// QR, opcode and RD from the query, RA set.
	flags := uint16(0x8000) | q.flags&0x7900 | 0x0080 | uint16(rcode&0xf)
	binary.BigEndian.PutUint16(out[2:], flags)
	binary.BigEndian.PutUint16(out[4:], 1)
	binary.BigEndian.PutUint16(out[6:], uint16(len(ips)))
	out = append(out, query[12:q.end]...)
	for _, ip := range ips {
		a := ip.As4()
		out = append(out, 0xc0, 12) // pointer to the question name
		out = binary.BigEndian.AppendUint16(out, dnsTypeA)
		out = binary.BigEndian.AppendUint16(out, dnsClassIN)
		out = binary.BigEndian.AppendUint32(out, dnsTTL)
		out = binary.BigEndian.AppendUint16(out, 4)
		out = append(out, a[:]...)
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
		if len(msg) >= 12 && q.end == 0 {
			q = dnsQuestion{id: binary.BigEndian.Uint16(msg), end: 12}
			return dnsResponse(msg[:12], q, rcodeFormErr, nil)
		}
		return nil
	}
	if (q.flags>>11)&0xf != 0 {
		return dnsResponse(msg, q, rcodeNotImp, nil)
	}
	d := Decision{SandboxID: st.id, Proto: "dns", Host: q.name, DstPort: 53}
	allowedName, denied := pol.nameAllowed(q.name)
	if denied {
		d.Verdict, d.Rule = "deny", "name-denied"
		p.emit(d)
		return dnsResponse(msg, q, rcodeNXDomain, nil)
	}
	if !allowedName {
		// No hostname rule allows it: refuse without asking upstream, so
		// that the name itself (a classic exfiltration channel) never
		// leaves the host. CIDR rules are for addresses, not for names.
		d.Verdict, d.Rule = "deny", "default-deny"
		p.emit(d)
		return dnsResponse(msg, q, rcodeRefused, nil)
	}
	if q.qclass != dnsClassIN || q.qtype != dnsTypeA {
		// The sandbox has IPv4 only; other types (TXT, MX, ...) would only
		// widen the channel a policy is meant to close.
		return dnsResponse(msg, q, rcodeOK, nil)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ips, err := p.res.lookup(rctx, q.name)
	cancel()
	if errors.Is(err, errNoSuchHost) {
		return dnsResponse(msg, q, rcodeNXDomain, nil)
	}
	if err != nil {
		return dnsResponse(msg, q, rcodeServFail, nil)
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
		return dnsResponse(msg, q, rcodeRefused, nil)
	}
	d.Verdict, d.Rule = "allow", "dns"
	if len(keep) > 0 {
		d.DstIP = keep[0]
	}
	p.emit(d)
	return dnsResponse(msg, q, rcodeOK, keep)
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

// truncate keeps the header and question and sets TC (the client retries over TCP).
func truncate(resp []byte) []byte {
	q, err := parseDNSQuery(append([]byte{resp[0], resp[1], 0, 0}, resp[4:]...))
	if err != nil {
		return resp[:12]
	}
	out := append([]byte(nil), resp[:q.end]...)
	out[2] |= 0x02
	binary.BigEndian.PutUint16(out[6:], 0)
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

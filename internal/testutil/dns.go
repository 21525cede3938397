package testutil

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// DNSServer is a tiny upstream resolver for tests, on 127.0.0.1 (UDP): it
// answers every A query with Answer and counts the queries it saw per name,
// so a test can assert that a name was, or was never, asked upstream.
// Names ending in a suffix set with SetSlow are answered late.
type DNSServer struct {
	Addr   netip.AddrPort
	Answer netip.Addr

	mu         sync.Mutex
	counts     map[string]int
	SlowSuffix string
	Delay      time.Duration
}

// StartDNSServer serves until the test ends.
func StartDNSServer(t testing.TB, answer netip.Addr) *DNSServer {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &DNSServer{Addr: netip.MustParseAddrPort(pc.LocalAddr().String()), Answer: answer, counts: map[string]int{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			buf := make([]byte, 1500)
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			name, end, ok := dnsQuestion(buf[:n])
			if !ok {
				continue
			}
			s.mu.Lock()
			s.counts[name]++
			slow := s.SlowSuffix != "" && strings.HasSuffix(name, s.SlowSuffix)
			delay := s.Delay
			s.mu.Unlock()
			reply := func() { _, _ = pc.WriteTo(dnsAnswer(buf[:end], s.Answer), from) }
			if slow {
				wg.Go(func() { time.Sleep(delay); reply() })
			} else {
				reply()
			}
		}
	})
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	return s
}

// SetSlow makes names ending in suffix answered after delay.
func (s *DNSServer) SetSlow(suffix string, delay time.Duration) {
	s.mu.Lock()
	s.SlowSuffix, s.Delay = suffix, delay
	s.mu.Unlock()
}

// Count is how many queries for name (lower case, no trailing dot) arrived.
func (s *DNSServer) Count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[name]
}

// Total is how many queries arrived for names ending in suffix.
func (s *DNSServer) Total(suffix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, v := range s.counts {
		if strings.HasSuffix(k, suffix) {
			n += v
		}
	}
	return n
}

func dnsQuestion(b []byte) (name string, end int, ok bool) {
	if len(b) < 12 || binary.BigEndian.Uint16(b[4:]) != 1 {
		return "", 0, false
	}
	var labels []string
	i := 12
	for i < len(b) {
		l := int(b[i])
		i++
		if l == 0 {
			if i+4 > len(b) {
				return "", 0, false
			}
			return strings.ToLower(strings.Join(labels, ".")), i + 4, true
		}
		if l > 63 || i+l > len(b) {
			return "", 0, false
		}
		labels = append(labels, string(b[i:i+l]))
		i += l
	}
	return "", 0, false
}

// dnsAnswer answers query (header and question) with one A record for an
// A/IN question, and no records otherwise.
func dnsAnswer(query []byte, ip netip.Addr) []byte {
	out := append([]byte(nil), query...)
	out[2] = 0x80 | query[2]&0x79
	out[3] = 0x80
	binary.BigEndian.PutUint16(out[6:], 0)
	binary.BigEndian.PutUint16(out[8:], 0)
	binary.BigEndian.PutUint16(out[10:], 0)
	qtype := binary.BigEndian.Uint16(query[len(query)-4:])
	if qtype != 1 || !ip.Is4() {
		return out
	}
	binary.BigEndian.PutUint16(out[6:], 1)
	a := ip.As4()
	out = append(out, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4)
	return append(out, a[:]...)
}

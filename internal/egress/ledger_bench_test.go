package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/effects"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

type benchCore struct{ st store.Store }

func (c benchCore) Store() store.Store { return c.st }
func (c benchCore) Visible(context.Context, string, string) (*sandbox.Sandbox, error) {
	return nil, errs.E(errs.NotFound, "none")
}

// httpsPath is the proxy's interception path for one sandbox with a
// granted secret for example.com, in front of a local TLS server; with
// ledger, the real side-effect ledger over SQLite records every request
// (a request with an injected secret is always a side effect).
type httpsPath struct {
	px     *egress.Proxy
	led    *effects.Service // nil without the ledger
	st     store.Store      // the ledger's store (nil without)
	dbPath string
	up     *httptest.Server
	roots  *x509.CertPool
	wg     sync.WaitGroup
}

func newHTTPSPath(b *testing.B, ledger bool, delay time.Duration) *httpsPath {
	return newHTTPSPathWith(b, pathOptions{ledger: ledger, handler: upstreamHandler(delay, nil)})
}

// pathOptions shape an httpsPath: the upstream's handler, the store and
// the ledger wrapped (nil: as they are; the phase benchmark times them),
// and an upstream the proxy does not trust (untrusted).
type pathOptions struct {
	ledger     bool
	handler    http.Handler
	wrapStore  func(store.Store) store.Store
	wrapLedger func(egress.Ledger) egress.Ledger
	untrusted  bool
}

func newHTTPSPathWith(b testing.TB, o pathOptions) *httpsPath {
	b.Helper()
	up := httptest.NewUnstartedServer(o.handler)
	up.Config.ErrorLog = log.New(io.Discard, "", 0) // a client that never spoke (b.N=1 of c8) is no finding
	up.StartTLS()
	b.Cleanup(up.Close)
	dir := b.TempDir()
	caFile := filepath.Join(dir, "up.pem")
	trusted := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw})
	if o.untrusted {
		other, err := egress.LoadOrCreateCA(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		trusted = other.PEM()
	}
	if err := os.WriteFile(caFile, trusted, 0o600); err != nil {
		b.Fatal(err)
	}
	h := &httpsPath{}
	ca, err := egress.LoadOrCreateCA(dir)
	if err != nil {
		b.Fatal(err)
	}
	px, err := egress.New(egress.Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1"),
		CA: ca, ExtraCAFile: caFile})
	if err != nil {
		b.Fatal(err)
	}
	pol, _ := egress.ParsePolicy("rules", []string{"example.com"}, nil)
	if err := px.SetSandbox("bs", netip.MustParseAddr("10.88.0.9"), pol); err != nil {
		b.Fatal(err)
	}
	if err := px.SetGrants("bs", []egress.Grant{{Name: "TOKEN", Host: "example.com", HeaderTemplate: "Authorization: Bearer {{value}}",
		Value: "sk_live_x", Placeholder: egress.NewPlaceholder("TOKEN")}}); err != nil {
		b.Fatal(err)
	}
	if o.ledger {
		h.dbPath = filepath.Join(dir, "berth.db")
		st, err := store.OpenSQLite(h.dbPath)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		if err := st.CreateSandbox(b.Context(), &sandbox.Sandbox{ID: "bs", Owner: "o", Template: "t", TemplateID: "sha256:aa", Runtime: "runc",
			State: sandbox.Creating, Resources: sandbox.Resources{CPUMillis: 100, MemoryMiB: 64, DiskMiB: 64, Pids: 16},
			ExpiresAt: time.Now().Add(time.Hour), ExpiryAction: sandbox.ExpireStop}); err != nil {
			b.Fatal(err)
		}
		h.st = st
		core := benchCore{st}
		if o.wrapStore != nil {
			core.st = o.wrapStore(st)
		}
		led := effects.New(core, effects.Config{MaxPerSandbox: 1 << 30, ReplayBudget: 1 << 40})
		b.Cleanup(func() { _ = led.Flush(context.Background()) }) // before the store closes
		var l egress.Ledger = led
		if o.wrapLedger != nil {
			l = o.wrapLedger(led)
		}
		px.SetLedger(l)
		h.led = led
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM())
	h.px, h.up, h.roots = px, up, roots
	return h
}

// conn opens one sandbox connection through the interception path.
func (h *httpsPath) conn(b testing.TB) *tls.Conn {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		c, err := ln.Accept()
		ln.Close() // after the accept: closing it earlier would reset the queued connection
		if err != nil {
			return
		}
		defer c.Close()
		u, err := net.Dial("tcp4", h.up.Listener.Addr().String())
		if err != nil {
			return
		}
		defer u.Close()
		_ = h.px.InterceptForTest(context.Background(), "bs", "example.com", 443, c, u)
	}()
	raw, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	return tls.Client(raw, &tls.Config{ServerName: "example.com", RootCAs: h.roots, NextProtos: []string{"http/1.1"}})
}

const benchBody = `{"amount":500,"currency":"usd"}`

func roundTrip(b *testing.B, c *tls.Conn, br *bufio.Reader, i int) {
	req := "POST /v1/charges HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer $TOKEN\r\nContent-Type: application/json\r\n" +
		"Idempotency-Key: bench-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "\r\nContent-Length: " +
		strconv.Itoa(len(benchBody)) + "\r\n\r\n" + benchBody
	if _, err := io.WriteString(c, req); err != nil {
		b.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkHTTPSRequest is one HTTPS request through the proxy's
// interception path — TLS from the sandbox terminated with berth's CA, the
// secret injected, verified TLS to the upstream — from the client's dial
// (newconn) or its write of the request (keepalive) to the last byte of
// the answer: today's injection path (no-ledger) against
// the same path with the side-effect ledger (the intent committed to
// SQLite, synchronous=FULL, before the request is sent; the outcome
// committed after the answer is relayed, off the request path).
//
//   - newconn: a new connection per request, the dial and both TLS
//     handshakes inside the timing.
//   - keepalive: requests one after another on one kept-alive connection.
//   - keepalive/up20ms: the same, the upstream answering after 20 ms.
//   - keepalive/c8: 8 clients at once, each on its own kept-alive
//     connection; ns/op is wall time per request (1/throughput) and
//     ms/req the mean time of one request as its client sees it.
func BenchmarkHTTPSRequest(b *testing.B) {
	type variant struct {
		name      string
		keepalive bool
		delay     time.Duration
		clients   int
	}
	for _, v := range []variant{{"newconn", false, 0, 1}, {"keepalive", true, 0, 1},
		{"keepalive/up20ms", true, 20 * time.Millisecond, 1}, {"keepalive/c8", true, 0, 8}} {
		for _, ledger := range []bool{false, true} {
			name := "no-ledger/" + v.name
			if ledger {
				name = "ledger/" + v.name
			}
			b.Run(name, func(b *testing.B) { benchHTTPS(b, ledger, v.keepalive, v.delay, v.clients) })
		}
	}
}

func benchHTTPS(b *testing.B, ledger, keepalive bool, delay time.Duration, clients int) {
	h := newHTTPSPath(b, ledger, delay)
	type client struct {
		c  *tls.Conn
		br *bufio.Reader
	}
	cs := make([]client, clients)
	if keepalive {
		for i := range cs {
			cs[i].c = h.conn(b)
			cs[i].br = bufio.NewReader(cs[i].c)
		}
	}
	var (
		mu    sync.Mutex
		spent time.Duration
		n     int
	)
	var each []time.Duration // one client: every request's time, for p50-ms
	b.ResetTimer()
	if clients == 1 {
		for i := 0; b.Loop(); i++ {
			t := time.Now()
			c := &cs[0]
			if !keepalive {
				c.c = h.conn(b)
				c.br = bufio.NewReader(c.c)
			}
			roundTrip(b, c.c, c.br, i)
			each = append(each, time.Since(t))
			if !keepalive {
				c.c.Close()
			}
		}
	} else {
		var wg sync.WaitGroup
		var next int64
		var nmu sync.Mutex
		take := func() (int, bool) {
			nmu.Lock()
			defer nmu.Unlock()
			next++
			return int(next), next <= int64(b.N)
		}
		for k := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i, ok := take()
					if !ok {
						return
					}
					t := time.Now()
					roundTrip(b, cs[k].c, cs[k].br, i)
					mu.Lock()
					spent += time.Since(t)
					n++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	b.StopTimer()
	if n > 0 {
		b.ReportMetric(float64(spent.Microseconds())/float64(n)/1000, "ms/req")
	}
	if len(each) > 0 {
		// The median: on a shared machine the mean (ns/op) carries every
		// stall of the neighbours' work.
		slices.Sort(each)
		b.ReportMetric(float64(each[len(each)/2].Microseconds())/1000, "p50-ms")
	}
	if h.led != nil {
		_ = h.led.Flush(context.Background())
		if commits, writes := h.led.Commits(); commits > 0 {
			b.ReportMetric(float64(commits)/float64(b.N), "commits/req")
			b.ReportMetric(float64(writes)/float64(commits), "writes/commit")
		}
	}
	for _, c := range cs {
		if c.c != nil {
			c.c.Close()
		}
	}
	h.wg.Wait()
}

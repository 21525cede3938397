package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
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
	px    *egress.Proxy
	up    *httptest.Server
	roots *x509.CertPool
	wg    sync.WaitGroup
}

func newHTTPSPath(b *testing.B, ledger bool) *httpsPath {
	b.Helper()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
	up.StartTLS()
	b.Cleanup(up.Close)
	dir := b.TempDir()
	caFile := filepath.Join(dir, "up.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600); err != nil {
		b.Fatal(err)
	}
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
	if ledger {
		st, err := store.OpenSQLite(filepath.Join(dir, "berth.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		if err := st.CreateSandbox(b.Context(), &sandbox.Sandbox{ID: "bs", Owner: "o", Template: "t", TemplateID: "sha256:aa", Runtime: "runc",
			State: sandbox.Creating, Resources: sandbox.Resources{CPUMillis: 100, MemoryMiB: 64, DiskMiB: 64, Pids: 16},
			ExpiresAt: time.Now().Add(time.Hour), ExpiryAction: sandbox.ExpireStop}); err != nil {
			b.Fatal(err)
		}
		px.SetLedger(effects.New(benchCore{st}, effects.Config{MaxPerSandbox: 1 << 30, ReplayBudget: 1 << 40}))
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM())
	return &httpsPath{px: px, up: up, roots: roots}
}

// conn opens one sandbox connection through the interception path.
func (h *httpsPath) conn(b *testing.B) *tls.Conn {
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

// BenchmarkHTTPSRequest is one HTTPS request on a new connection through
// the proxy's interception path — TLS from the sandbox terminated with
// berth's CA, the secret injected, verified TLS to the upstream — from the
// client's dial to the last byte of the answer: today's injection path
// (no-ledger) against the same path with the side-effect ledger (intent
// and outcome written to SQLite, synchronous=FULL, before the answer is
// relayed). keepalive: the same, requests on one kept-alive connection.
func BenchmarkHTTPSRequest(b *testing.B) {
	for _, tc := range []struct {
		name      string
		ledger    bool
		keepalive bool
	}{{"no-ledger", false, false}, {"ledger", true, false}, {"no-ledger/keepalive", false, true}, {"ledger/keepalive", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			h := newHTTPSPath(b, tc.ledger)
			var c *tls.Conn
			var br *bufio.Reader
			if tc.keepalive {
				c = h.conn(b)
				br = bufio.NewReader(c)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if !tc.keepalive {
					c = h.conn(b)
					br = bufio.NewReader(c)
				}
				roundTrip(b, c, br, i)
				if !tc.keepalive {
					c.Close()
				}
			}
			b.StopTimer()
			if c != nil {
				c.Close()
			}
			h.wg.Wait()
		})
	}
}

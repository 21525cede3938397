package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/client"
)

// The side-effect ledger's row (internal/effects, docs/EFFECTS.md): an
// HTTPS POST from inside a sandbox to an effectful host, recorded by the
// egress proxy, against the same POST to the same host not marked
// effectful, measured alternately on the same server.

const (
	defEffectsHTTPS = "An HTTPS POST (a 31-byte JSON body, a new Idempotency-Key each) from inside a running sandbox, sent by a Go client (the berth binary copied in, `berth bench https-client`) on one kept-alive connection through berth's egress proxy to a TLS service in another network namespace that answers 20 ms after it has read the request. The clock (the sandbox's) starts when the client sends the request and stops at the last byte of the answer; the connection's first request (dial, handshakes) is not counted. The host is effectful: the proxy terminates the sandbox's TLS with berth's CA, records the intent (SQLite, synchronous=FULL) before the request goes upstream over verified TLS, and the outcome after the answer is relayed. Baseline: the same POSTs from a sandbox with the same policy but the host not effectful (TLS end to end through the proxy, nothing recorded), alternating with it (which goes first alternates too). Goal ratio ≤ 1.10. Derived intercepted_get_p50_ms: GETs to the effectful host from the same sandbox, intercepted (TLS terminated and re-made, relayed request by request) but not recorded: the interception's share without the ledger's."
	defEffectsPlain = "The same POSTs from a sandbox allowed the same host, not marked effectful: the proxy relays the TLS stream without terminating it and records nothing."
	// effectsPerExec is how many POSTs one client run times after its
	// connection's first.
	effectsPerExec  = 3
	clientInSandbox = "/home/user/berth-bench-client"
	upCAInSandbox   = "/home/user/berth-bench-up.pem"
	egressCA        = "/usr/local/share/ca-certificates/berth-egress.crt"
)

func (r *Runner) effectsHTTPS(ctx context.Context, rt string) []Metric {
	m := Metric{Name: "effects-https", Runtime: rt, Unit: "ms", Definition: defEffectsHTTPS, Available: true, Samples: []float64{}}
	fail := func(reason string) []Metric { return []Metric{notAvailable(m.Name, rt, m.Unit, m.Definition, reason)} }
	up := r.o.Upstream
	switch {
	case up == nil && r.o.UpstreamErr != nil:
		return fail("the TLS test service could not be started: " + r.o.UpstreamErr.Error())
	case up == nil:
		return fail("needs --self: the bench starts the TLS test service and a server that resolves and trusts it (--egress-hosts, --upstream-ca)")
	case r.o.BerthBin == "":
		return fail("the berth binary (the client copied into the sandbox) was not found")
	case !static(r.o.BerthBin):
		return fail(r.o.BerthBin + " is dynamically linked: the client copied into the sandbox must be static (build with CGO_ENABLED=0, as the Makefile does)")
	}
	with, err := r.create(ctx, rt, func(c *wire.CreateRequest) {
		c.Allow, c.Effects = []string{up.Host}, &wire.EffectSettings{Effectful: []string{up.Host}}
	})
	if err != nil {
		return fail("create with an effectful host: " + err.Error())
	}
	defer r.remove(ctx, with.ID)
	without, err := r.create(ctx, rt, func(c *wire.CreateRequest) { c.Allow = []string{up.Host} })
	if err != nil {
		return fail("create: " + err.Error())
	}
	defer r.remove(ctx, without.ID)
	for _, id := range []string{with.ID, without.ID} {
		if err := r.installClient(ctx, id, up); err != nil {
			return fail("install the client: " + err.Error())
		}
	}
	url := "https://" + up.Host + "/v1/charges"
	served := up.Requests.Load() // the service is shared by the runtimes' rows
	run := func(id, method string, recorded bool, round int) ([]float64, error) {
		res, err := r.c.Exec(ctx, id, clientInSandbox, "bench", "https-client", "--ca", egressCA+","+upCAInSandbox,
			"--n", strconv.Itoa(1+effectsPerExec), "--key", newID("k")+"-"+strconv.Itoa(round), "--method", method, url)
		if err != nil {
			return nil, err
		}
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("client exit %d: %s", res.ExitCode, tailString(res.Stdout, 400))
		}
		var out []float64
		for i, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
			f := strings.Fields(line)
			if len(f) < 1 {
				return nil, fmt.Errorf("client said %q", line)
			}
			v, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return nil, fmt.Errorf("client said %q", line)
			}
			// The ledger names each recorded effect in Berth-Effect; the
			// baseline's answers must carry none.
			if effect := len(f) > 1 && strings.HasPrefix(f[1], "ef"); effect != recorded {
				return nil, fmt.Errorf("answer %d: Berth-Effect %q, want recorded=%v", i, strings.Join(f[1:], " "), recorded)
			}
			if i > 0 {
				out = append(out, v)
			}
		}
		if len(out) != effectsPerExec {
			return nil, fmt.Errorf("client timed %d requests, want %d", len(out), effectsPerExec)
		}
		return out, nil
	}
	var base, get []float64
	var baseErr []string
	for i := 0; i < r.o.Warmups+r.o.Runs && ctx.Err() == nil; i++ {
		// Which goes first alternates, so neither gains from its place.
		for _, recorded := range [][]bool{{true, false}, {false, true}}[i%2] {
			id := without.ID
			if recorded {
				id = with.ID
			}
			ds, err := run(id, http.MethodPost, recorded, i)
			switch {
			case err != nil && recorded:
				m.Errors = append(m.Errors, err.Error())
			case err != nil:
				baseErr = append(baseErr, err.Error())
			case i < r.o.Warmups:
			case recorded:
				m.Samples = append(m.Samples, ds...)
			default:
				base = append(base, ds...)
			}
		}
		// A GET to the effectful host is intercepted (TLS terminated,
		// relayed request by request) but not recorded: it splits the
		// interception's share from the ledger's.
		if ds, err := run(with.ID, http.MethodGet, false, i); err == nil && i >= r.o.Warmups {
			get = append(get, ds...)
		}
		if len(m.Errors) > 3 && len(m.Samples) == 0 {
			break
		}
	}
	m.Derived = map[string]float64{}
	if l, err := r.c.Sandbox(with.ID).Effects(ctx, ""); err == nil {
		m.Derived["effects_recorded"], m.Derived["upstream_requests"] = float64(len(l.Effects)), float64(up.Requests.Load()-served)
	}
	if len(get) > 0 {
		m.Derived["intercepted_get_p50_ms"] = Summarize(get).P50
	}
	m.Notes = strconv.Itoa(effectsPerExec) + " timed POSTs per client run (after its connection's first), " + strconv.Itoa(r.o.Warmups) + " warm-up run(s) per sandbox"
	m.Baseline = baseline("the same POST, host not effectful", defEffectsPlain, base, baseErr)
	return []Metric{m}
}

// static reports whether the ELF binary at path needs no interpreter.
func static(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// installClient copies the berth binary (static; its `bench https-client`
// is the client) and the test service's CA into sandbox id.
func (r *Runner) installClient(ctx context.Context, id string, up *HTTPSUpstream) error {
	for _, f := range []struct {
		src, dst string
		mode     uint32
	}{{r.o.BerthBin, clientInSandbox, 0o755}, {up.CAFile, upCAInSandbox, 0o644}} {
		fh, err := os.Open(f.src)
		if err != nil {
			return err
		}
		_, err = r.c.Sandbox(id).WriteFile(ctx, f.dst, fh, client.WriteFileOptions{Mode: f.mode})
		fh.Close()
		if err != nil {
			return fmt.Errorf("upload %s: %w", f.dst, err)
		}
	}
	return nil
}

// RunHTTPSClient is `berth bench https-client`, the effects-https row's
// client inside the sandbox: N requests on one kept-alive HTTP/1.1
// connection, each with its own Idempotency-Key (KEY-i); per request it
// prints the time from sending to the answer's last byte in ms and the
// answer's Berth-Effect header.
func RunHTTPSClient(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("https-client", flag.ContinueOnError)
	ca := fs.String("ca", "", "comma-separated PEM files of the CAs to trust")
	n := fs.Int("n", 4, "requests")
	key := fs.String("key", "bench", "Idempotency-Key prefix")
	method := fs.String("method", http.MethodPost, "request method")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *n < 1 || *n > 1000 {
		return fmt.Errorf("usage: berth bench https-client [--ca FILES] [--n 1..1000] [--key K] [--method M] URL")
	}
	pool := x509.NewCertPool()
	for _, f := range strings.Split(*ca, ",") {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("--ca: no certificate in %s", f)
		}
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1,
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}} // HTTP/1.1, as the proxy intercepts
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for i := range *n {
		req, err := http.NewRequest(*method, fs.Arg(0), strings.NewReader(`{"amount":500,"currency":"usd"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", *key+"-"+strconv.Itoa(i))
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		d := time.Since(start)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("request %d: %s: %s", i, resp.Status, tailString(string(body), 200))
		}
		fmt.Fprintf(stdout, "%.3f %s\n", ms(d), resp.Header.Get("Berth-Effect"))
	}
	return nil
}

package egress

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memLedger is a Ledger kept in memory: it records intents and outcomes
// in order, and answers a key it has a completed outcome for from it.
type memLedger struct {
	mu       sync.Mutex
	intents  []Intent
	outcomes map[string]Outcome
	byKey    map[string]string
	setKey   string
	refuse   bool
}

func (l *memLedger) Begin(_ context.Context, in Intent) (Ticket, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse {
		return Ticket{Status: http.StatusConflict, Message: "refused by the test ledger"}, nil
	}
	if id, ok := l.byKey[in.Key]; ok && in.Key != "" {
		if o, done := l.outcomes[id]; done {
			return Ticket{Effect: id, Replay: &Replay{Status: o.Status, Header: o.Header, Body: o.Body}}, nil
		}
	}
	l.intents = append(l.intents, in)
	id := "ef" + strconv.Itoa(len(l.intents))
	if in.Key != "" {
		l.byKey[in.Key] = id
	}
	return Ticket{Effect: id, SetKey: l.setKey}, nil
}

func (l *memLedger) Finish(_ context.Context, id string, o Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outcomes[id] = o
}

// outcome waits for the outcome of effect id (recorded once the answer
// has been relayed).
func (l *memLedger) outcome(t *testing.T, id string) Outcome {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		l.mu.Lock()
		o, ok := l.outcomes[id]
		l.mu.Unlock()
		if ok {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome recorded for %s", id)
		}
	}
}

func (l *memLedger) nIntents() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.intents)
}

// effectPair runs relayHTTP for good.test (effectful) with led as the ledger.
func effectPair(t *testing.T, upstream http.Handler, led Ledger, eff EffectPolicy) (net.Conn, *bufio.Reader) {
	t.Helper()
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	px, err := New(Config{ProxyAddr: netip.MustParseAddrPort("127.0.0.1:1"), DNSAddr: netip.MustParseAddrPort("127.0.0.1:1")})
	must(t, err)
	pol := mustPolicy(t, Rules, []string{"good.test"}, nil)
	pol.Effects = eff
	must(t, px.SetSandbox("rl", netip.MustParseAddr("10.88.0.2"), pol))
	px.SetLedger(led)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	sb, err := net.Dial("tcp4", ln.Addr().String())
	must(t, err)
	client, err := ln.Accept()
	must(t, err)
	upc, err := net.Dial("tcp4", srv.Listener.Addr().String())
	must(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _, _ = px.relayHTTP(px.byID["rl"], Query{IP: netip.MustParseAddr("198.51.100.1"), Port: 80}, "good.test",
			&prefixConn{Conn: client}, upc.(*net.TCPConn))
		client.Close()
		upc.Close()
	})
	t.Cleanup(func() { sb.Close(); wg.Wait() })
	_ = sb.SetDeadline(time.Now().Add(10 * time.Second))
	return sb, bufio.NewReader(sb)
}

func roundTrip(t *testing.T, sb net.Conn, br *bufio.Reader, method, path, key, body string) (*http.Response, string) {
	t.Helper()
	req := method + " " + path + " HTTP/1.1\r\nHost: good.test\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
	if key != "" {
		req += "Idempotency-Key: " + key + "\r\n"
	}
	if _, err := io.WriteString(sb, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestRecordIntentBeforeSend(t *testing.T) {
	led := &memLedger{outcomes: map[string]Outcome{}, byKey: map[string]string{}, setKey: "berth-derived"}
	var hits atomic.Int32
	var sawIntent, sawKey atomic.Value
	sb, br := effectPair(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		// The test host holds the request: the intent must already be in the ledger.
		sawIntent.Store(led.nIntents())
		sawKey.Store(r.Header.Get("Idempotency-Key"))
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Made", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made:"+string(b))
	}), led, EffectPolicy{Hosts: []Rule{{Kind: RuleHost, Host: "good.test"}}})

	resp, body := roundTrip(t, sb, br, "POST", "/charge?x=1", "", "amount=5")
	if resp.StatusCode != http.StatusCreated || body != "made:amount=5" || resp.Header.Get(EffectHeader) != "ef1" {
		t.Fatalf("POST: %d %q (%s=%q)", resp.StatusCode, body, EffectHeader, resp.Header.Get(EffectHeader))
	}
	if n := sawIntent.Load(); n != 1 {
		t.Fatalf("the upstream saw %v intents recorded when the request arrived, want 1 (intent before send)", n)
	}
	if k := sawKey.Load(); k != "berth-derived" {
		t.Fatalf("upstream Idempotency-Key = %q, want the ledger's derived key", k)
	}
	sum := sha256.Sum256([]byte("amount=5"))
	out := led.outcome(t, "ef1")
	led.mu.Lock()
	in := led.intents[0]
	led.mu.Unlock()
	if in.Method != "POST" || in.Host != "good.test" || in.Path != "/charge?x=1" || in.BodySHA256 != hex.EncodeToString(sum[:]) || in.BodySize != 8 {
		t.Fatalf("intent = %+v", in)
	}
	if out.Status != 201 || !out.Complete || string(out.Body) != "made:amount=5" || out.Header.Get("X-Made") != "yes" {
		t.Fatalf("outcome = %+v", out)
	}
	// A GET to an effectful host is not a side effect: relayed unrecorded.
	if resp, _ := roundTrip(t, sb, br, "GET", "/status", "", ""); resp.StatusCode != 201 || led.nIntents() != 1 {
		t.Fatalf("GET: %d, %d intents; want relayed without a record", resp.StatusCode, led.nIntents())
	}
	if hits.Load() != 2 {
		t.Fatalf("upstream hits = %d, want 2", hits.Load())
	}
}

func TestRecordReplayAndRefusalNeverSent(t *testing.T) {
	led := &memLedger{outcomes: map[string]Outcome{}, byKey: map[string]string{}}
	var hits atomic.Int32
	sb, br := effectPair(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "once")
	}), led, EffectPolicy{Hosts: []Rule{{Kind: RuleWildcard, Host: "test"}}})
	if resp, body := roundTrip(t, sb, br, "PUT", "/x", "key-1", "v"); resp.StatusCode != 200 || body != "once" {
		t.Fatalf("first PUT: %d %q", resp.StatusCode, body)
	}
	led.outcome(t, "ef1")
	resp, body := roundTrip(t, sb, br, "PUT", "/x", "key-1", "v")
	if resp.StatusCode != 200 || body != "once" || !strings.HasSuffix(resp.Header.Get(EffectHeader), "replayed") {
		t.Fatalf("repeat: %d %q %q; want the recorded answer, marked replayed", resp.StatusCode, body, resp.Header.Get(EffectHeader))
	}
	if hits.Load() != 1 {
		t.Fatalf("upstream hits = %d, want 1 (a replay is not sent)", hits.Load())
	}
	led.mu.Lock()
	led.refuse = true
	led.mu.Unlock()
	if resp, body := roundTrip(t, sb, br, "PUT", "/y", "key-2", "v"); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "refused by the test ledger") {
		t.Fatalf("refusal: %d %q", resp.StatusCode, body)
	}
	if hits.Load() != 1 {
		t.Fatalf("upstream hits = %d after a refusal, want 1", hits.Load())
	}
}

func TestRecordBoundsHostileBodies(t *testing.T) {
	led := &memLedger{outcomes: map[string]Outcome{}, byKey: map[string]string{}}
	var hits atomic.Int32
	eff := EffectPolicy{Hosts: []Rule{{Kind: RuleHost, Host: "good.test"}}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(make([]byte, MaxReplayBody+10)) // an answer too big to keep
	})
	// A declared body over the bound: 413 before anything is read or sent.
	sb, br := effectPair(t, handler, led, eff)
	if _, err := io.WriteString(sb, "POST /big HTTP/1.1\r\nHost: good.test\r\nContent-Length: "+strconv.Itoa(MaxEffectBody+1)+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared huge body: %v %v; want 413", resp, err)
	}
	// The same, with the client writing the whole body before it reads:
	// the refusal must not reset the connection under its write.
	sbw, brw := effectPair(t, handler, led, eff)
	huge := "POST /big HTTP/1.1\r\nHost: good.test\r\nContent-Length: " + strconv.Itoa(MaxEffectBody+(4<<20)) + "\r\n\r\n" + strings.Repeat("b", MaxEffectBody+(4<<20))
	if _, err := io.WriteString(sbw, huge); err != nil {
		t.Fatalf("writing a refused body whole: %v; want the proxy to drain it, not reset", err)
	}
	if resp, err := http.ReadResponse(brw, nil); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared huge body written whole: %v %v; want 413", resp, err)
	}
	// A chunked body that grows past the bound: 413 too, nothing sent.
	sb2, br2 := effectPair(t, handler, led, eff)
	if _, err := io.WriteString(sb2, "POST /big HTTP/1.1\r\nHost: good.test\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	go func() {
		chunk := strings.Repeat("a", 1<<20)
		for range 9 {
			if _, err := io.WriteString(sb2, strconv.FormatInt(int64(len(chunk)), 16)+"\r\n"+chunk+"\r\n"); err != nil {
				return
			}
		}
	}()
	resp, err = http.ReadResponse(br2, nil)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked huge body: %v %v; want 413", resp, err)
	}
	if hits.Load() != 0 || led.nIntents() != 0 {
		t.Fatalf("upstream hits %d, intents %d; want none for refused bodies", hits.Load(), led.nIntents())
	}
	// An over-long Idempotency-Key is refused.
	sb3, br3 := effectPair(t, handler, led, eff)
	if resp, _ := roundTrip(t, sb3, br3, "POST", "/k", strings.Repeat("k", MaxIdempotencyKey+1), "x"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("long key: %d, want 400", resp.StatusCode)
	}
	// An answer over the replay bound is streamed whole but not kept.
	sb4, br4 := effectPair(t, handler, led, eff)
	resp, body := roundTrip(t, sb4, br4, "POST", "/ok", "", "x")
	if resp.StatusCode != 200 || len(body) != MaxReplayBody+10 {
		t.Fatalf("big answer: %d, %d bytes", resp.StatusCode, len(body))
	}
	o := led.outcome(t, "ef1")
	if o.Complete || o.Body != nil || o.Size != MaxReplayBody+10 || o.Err != nil {
		t.Fatalf("outcome of a big answer = complete %v, %d body bytes, size %d, err %v; want not replayable, size counted", o.Complete, len(o.Body), o.Size, o.Err)
	}
}

func TestEffectPolicyParse(t *testing.T) {
	if _, err := ParseEffectPolicy([]string{"api.test", "*.mail.test:443"}, "derive", "refuse"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		hosts            []string
		idem, rep, field string
	}{
		{[]string{"10.0.0.0/8"}, "", "", "effectful"},
		{[]string{"bad host"}, "", "", "effectful"},
		{nil, "always", "", "idempotency"},
		{nil, "", "twice", "repeat"},
	} {
		_, err := ParseEffectPolicy(tc.hosts, tc.idem, tc.rep)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("ParseEffectPolicy(%v, %q, %q) = %v; want an error naming %s", tc.hosts, tc.idem, tc.rep, err, tc.field)
		}
	}
	p := Policy{Mode: AllowAll, Effects: EffectPolicy{Hosts: []Rule{{Kind: RuleHost, Host: "api.test"}}, Repeat: RepeatRefuse}}
	b, err := MarshalPolicy(p)
	must(t, err)
	back, err := UnmarshalPolicy(b)
	must(t, err)
	if !back.Effects.Effectful("API.test.", 443) || back.Effects.Repeat != RepeatRefuse || back.Effects.Effectful("other.test", 443) {
		t.Fatalf("round trip of %s = %+v", b, back.Effects)
	}
	if !recordable(EffectPolicy{}, "x.test", 443, "GET", true) || recordable(back.Effects, "api.test", 443, "HEAD", false) {
		t.Fatal("recordable: a secret makes any request an effect; HEAD never is")
	}
}

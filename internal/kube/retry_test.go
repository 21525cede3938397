package kube_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
)

// throttler sits in front of the real API server and answers the first
// n requests 429 with Retry-After, as the server does while a resource's
// storage is (re)initializing; it records every body it saw.
type throttler struct {
	mu     sync.Mutex
	left   int
	bodies [][]byte
	next   http.Handler
}

func (th *throttler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	th.mu.Lock()
	th.bodies = append(th.bodies, b)
	throttle := th.left != 0
	if th.left > 0 {
		th.left--
	}
	th.mu.Unlock()
	if throttle {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","code":429}`))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	th.next.ServeHTTP(w, r)
}

func throttled(t *testing.T, n int) (*kube.Client, *throttler) {
	t.Helper()
	up, err := url.Parse(srv.Config.Server)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = &http.Transport{TLSClientConfig: insecureTLS()}
	th := &throttler{left: n, next: rp}
	hs := httptest.NewServer(th)
	t.Cleanup(hs.Close)
	kc, err := kube.New(kube.Config{Server: hs.URL, Token: srv.Config.Token})
	if err != nil {
		t.Fatal(err)
	}
	return kc, th
}

// TestThrottledRetried: a 429 with Retry-After is waited out and the
// request sent again with the same body; one that stays throttled ends
// as Unavailable after the bounded retries, and a cancelled context stops
// the wait at once.
func TestThrottledRetried(t *testing.T) {
	ns := srv.Namespace(t)
	kc, th := throttled(t, 2)
	start := time.Now()
	if err := kc.Create(t.Context(), berthv1.Records, ns, record(ns, "r", "x"), nil); err != nil {
		t.Fatalf("create through two 429s: %v", err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("answered in %v: Retry-After (1 s, twice) not waited", d)
	}
	var got berthv1.Record
	if err := srv.Client.Get(t.Context(), berthv1.Records, ns, "r", &got); err != nil || got.Spec.Data != "x" {
		t.Fatalf("object after the retried create: %+v %v", got.Spec, err)
	}
	th.mu.Lock()
	if len(th.bodies) != 3 || !bytes.Equal(th.bodies[0], th.bodies[2]) || len(th.bodies[0]) == 0 {
		t.Errorf("bodies sent: %d, first %q last %q", len(th.bodies), th.bodies[0], th.bodies[len(th.bodies)-1])
	}
	th.mu.Unlock()

	always, th2 := throttled(t, -1)
	err := always.Get(t.Context(), berthv1.Records, ns, "r", nil)
	if !errs.Is(err, errs.Unavailable) {
		t.Fatalf("always throttled: %v, want Unavailable", err)
	}
	th2.mu.Lock()
	if n := len(th2.bodies); n != 6 {
		t.Errorf("always throttled: %d requests, want 6 (1 + 5 retries)", n)
	}
	th2.mu.Unlock()

	ctx, cancel := contextWithTimeout(t, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := always.Get(ctx, berthv1.Records, ns, "r", nil); err == nil {
		t.Fatal("a throttled get with a short deadline succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a cancelled wait took %v", d)
	}
}

func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } // the test API server's own certificate

func contextWithTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}

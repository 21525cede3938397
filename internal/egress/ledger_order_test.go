package egress_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the upstream reads the ledger's file on its own connection

	"github.com/berth-dev/berth/internal/store"
)

// slowCommits holds every commit that carries an intent for a while
// before it is made, so that a request sent before its intent's commit
// would reach the upstream first.
type slowCommits struct {
	store.Store
	hold time.Duration
}

func (s slowCommits) WriteEffects(ctx context.Context, ws []store.EffectWrite) ([]error, error) {
	for _, w := range ws {
		if w.Record != nil {
			time.Sleep(s.hold)
			break
		}
	}
	return s.Store.WriteEffects(ctx, ws)
}

// post sends one recorded POST (a secret is injected) with key on c and
// returns the answer's status.
func post(t *testing.T, c io.ReadWriter, br *bufio.Reader, key string) int {
	t.Helper()
	req := "POST /v1/charges HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer $TOKEN\r\nIdempotency-Key: " + key +
		"\r\nContent-Length: " + strconv.Itoa(len(benchBody)) + "\r\n\r\n" + benchBody
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The ledger's promise, seen from the outside: the upstream never gets a
// recorded request whose intent is not committed. The upstream reads the
// ledger's SQLite file on its own connection the moment a request
// arrives; commits are held 30 ms, far longer than the upstream's TLS
// handshake, which runs alongside the first request's commit on each new
// connection (and a kept-alive connection's requests follow).
func TestUpstreamNeverSeesAnUnrecordedIntent(t *testing.T) {
	var (
		mu     sync.Mutex
		db     *sql.DB
		seen   []string
		faults []string
	)
	check := func(key string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, key)
		var state string
		if err := db.QueryRow(`SELECT state FROM effects WHERE idem_key = ?`, key).Scan(&state); err != nil {
			faults = append(faults, fmt.Sprintf("%s arrived upstream, its intent not in the ledger: %v", key, err))
		} else if state != store.EffectPending {
			faults = append(faults, fmt.Sprintf("%s arrived upstream in state %s; want pending (recorded, not finished)", key, state))
		}
	}
	h := newHTTPSPathWith(t, pathOptions{ledger: true,
		wrapStore: func(st store.Store) store.Store { return slowCommits{st, 30 * time.Millisecond} },
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			check(r.Header.Get("Idempotency-Key"))
			_, _ = io.WriteString(w, "ok")
		})})
	var err error
	mu.Lock()
	db, err = sql.Open("sqlite", h.dbPath+"?_pragma=busy_timeout(5000)")
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for n := range 3 {
		c := h.conn(t)
		br := bufio.NewReader(c)
		for i := range 3 {
			if st := post(t, c, br, "order-"+strconv.Itoa(n)+"-"+strconv.Itoa(i)); st != 200 {
				t.Fatalf("status %d", st)
			}
		}
		c.Close()
	}
	h.wg.Wait()
	if err := h.led.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 9 {
		t.Fatalf("upstream saw %d requests, want 9: %v", len(seen), seen)
	}
	if len(faults) > 0 {
		t.Fatal(strings.Join(faults, "\n"))
	}
}

// An upstream whose TLS cannot be verified: its handshake, run alongside
// the intent's commit, fails after the intent is recorded. Nothing was
// sent, so the effect is withdrawn (not unknown), and a retry with the
// same key is a new attempt, not refused as "may have happened".
func TestUpstreamHandshakeFailureWithdrawsTheIntent(t *testing.T) {
	h := newHTTPSPathWith(t, pathOptions{ledger: true, untrusted: true,
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("an unverified upstream got a request") })})
	for range 2 {
		c := h.conn(t)
		if st := post(t, c, bufio.NewReader(c), "pay-1"); st != http.StatusBadGateway {
			t.Fatalf("status %d; want 502 (upstream TLS failed)", st)
		}
		c.Close()
	}
	h.wg.Wait()
	if err := h.led.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	es, err := h.st.FindEffects(t.Context(), "bs", "pay-1", "", 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d effects recorded for the key, want 2 (the retry is a new attempt): %+v", len(es), es)
	}
	for _, e := range es {
		if e.State != store.EffectWithdrawn || !strings.HasPrefix(e.Reason, "not sent") {
			t.Errorf("effect %s: state %s (%q); want withdrawn, not sent", e.ID, e.State, e.Reason)
		}
	}
}

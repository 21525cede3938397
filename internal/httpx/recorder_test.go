package httpx

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRecorder(t *testing.T) {
	rr := httptest.NewRecorder()
	w := &Recorder{ResponseWriter: rr, Sniff: 4}
	_, _ = w.Write([]byte("ab"))
	_, _ = w.ReadFrom(strings.NewReader("cdefgh"))
	w.WriteHeader(http.StatusTeapot) // after the body: the first status stays
	if w.Status != http.StatusOK || string(w.Head) != "abcd" || rr.Body.String() != "abcdefgh" {
		t.Fatalf("status %d head %q body %q", w.Status, w.Head, rr.Body.String())
	}
	w2 := &Recorder{ResponseWriter: httptest.NewRecorder()}
	w2.WriteHeader(http.StatusCreated)
	_, _ = w2.Write([]byte("x"))
	if w2.Status != http.StatusCreated || len(w2.Head) != 0 {
		t.Fatalf("status %d head %q", w2.Status, w2.Head)
	}
	if w2.Unwrap() == nil {
		t.Fatal("Unwrap")
	}
}

package agentapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

// The agent runs inside the sandbox: every byte it answers is the tenant's.
// These targets fuzz only the decoding of its answers and events, not the
// transport that carries them.

// FuzzExecStream: any exec/attach stream body yields events until one exit
// event or an error, then only io.EOF; a cut stream is an Unavailable error.
func FuzzExecStream(f *testing.F) {
	for _, s := range []string{
		`{"type":"start","pid":42}` + "\n" + `{"type":"stdout","data":"aGkK"}` + "\n" + `{"type":"exit","exit_code":0,"exited":true,"status":"exit status 0"}` + "\n",
		`{"type":"start","pid":1}{"type":"exit","exit_code":137,"signal":"killed","status":"signal: killed"}{"type":"stdout"}`,
		`{"type":"error","error":"boom"}`, `{"type":"keepalive"}`, `{"type":"stdout","data":"!!"}`, `{"type":"exit","exit_code":1e99}`,
		`{"type":"start"`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s := newStream(&http.Response{Body: io.NopCloser(bytes.NewReader(body))}, func() {})
		defer s.Close()
		ended := false
		for range 10000 {
			ev, err := s.Next()
			if ended {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("after the end: %+v, %v; want io.EOF", ev, err)
				}
				return
			}
			if err == io.EOF { // a cut stream wraps io.EOF in an Unavailable error
				t.Fatalf("a bare io.EOF before an exit event or an error")
			}
			if err != nil {
				if errs.KindOf(err) != errs.Unavailable {
					t.Fatalf("stream error %v is not Unavailable", err)
				}
				ended = true
				continue
			}
			if ev.Type == "exit" {
				ended = true
			}
		}
	})
}

// FuzzWatchStream: any watch stream body yields events or an Unavailable
// error, never a panic.
func FuzzWatchStream(f *testing.F) {
	for _, s := range []string{`{"type":"start"}{"type":"create","path":"/home/user/a"}`, `{"type":"remove","path":1}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s := &WatchStream{body: io.NopCloser(bytes.NewReader(body)), dec: newEventReader(bytes.NewReader(body))}
		for range 10000 {
			if _, err := s.Next(); err != nil {
				if errs.KindOf(err) != errs.Unavailable {
					t.Fatalf("watch error %v is not Unavailable", err)
				}
				return
			}
		}
	})
}

// FuzzAnswers: the JSON answers of the agent's unary calls decode into
// their types or fail, and an error answer's code maps to a known kind.
func FuzzAnswers(f *testing.F) {
	for _, s := range []string{
		`{"code":"not_found","message":"no such file"}`, `{"code":"bogus"}`,
		`{"status":"ok","version":"1","uptime_ms":5}`,
		`{"name":"a","path":"/a","type":"file","size":3,"mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user","modified_time":"2026-01-01T00:00:00Z"}`,
		`[{"pid":1,"cmd":["sh"],"env":{"A":"1"}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Error
		if json.Unmarshal(b, &e) == nil && e.Code != "" {
			if k := kindByName(e.Code); k.String() == "" {
				t.Fatalf("code %q maps to a kind with no name", e.Code)
			}
		}
		for _, v := range []any{new(Health), new(Activity), new(EntryInfo), new([]EntryInfo), new([]ProcessInfo), new(FSEvent)} {
			_ = json.Unmarshal(b, v)
		}
	})
}

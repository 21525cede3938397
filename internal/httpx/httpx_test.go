package httpx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/duration"
	"github.com/berth-dev/berth/internal/errs"
)

// The package doc's table, pinned: every kind in both protocols and back.
func TestStatusTables(t *testing.T) {
	want := map[errs.Kind][2]int{
		errs.Internal:           {500, 500},
		errs.NotFound:           {404, 404},
		errs.AlreadyExists:      {409, 409},
		errs.InvalidArgument:    {400, 400},
		errs.FailedPrecondition: {409, 400},
		errs.Conflict:           {409, 409},
		errs.ResourceExhausted:  {429, 507},
		errs.PermissionDenied:   {403, 403},
		errs.Unauthenticated:    {401, 401},
		errs.Unavailable:        {503, 502},
		errs.NotImplemented:     {501, 501},
	}
	if len(want) != len(errs.Kinds()) {
		t.Fatalf("table covers %d kinds, errs has %d", len(want), len(errs.Kinds()))
	}
	for _, k := range errs.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			w, ok := want[k]
			if !ok {
				t.Fatalf("kind %v missing from the table", k)
			}
			if got := [2]int{Status(k), EnvdFilesStatus(k)}; got != w {
				t.Errorf("Status, EnvdFilesStatus = %v, want %v", got, w)
			}
			back := KindOfStatus(Status(k))
			if Status(back) != Status(k) {
				t.Errorf("KindOfStatus(%d) = %v, which maps to %d", Status(k), back, Status(back))
			}
			if k != errs.AlreadyExists && k != errs.FailedPrecondition && back != k {
				t.Errorf("KindOfStatus(%d) = %v, want %v", Status(k), back, k)
			}
		})
	}
	if KindOfStatus(418) != errs.Internal || Status(errs.Kind(99)) != 500 {
		t.Error("unknown statuses and kinds are internal")
	}
}

func TestWriteError(t *testing.T) {
	full := &errs.Error{Kind: errs.ResourceExhausted, Message: "no space left on device"}
	for _, tc := range []struct {
		name string
		err  error
		want Error
	}{
		{"full disk under Internal wraps", errs.Wrap(errs.Internal, fmt.Errorf("upload: %w", errs.Wrap(errs.Internal, full, "agent")), "files"),
			Error{Code: 429, Message: "files: upload: agent: no space left on device", Reason: "resource_exhausted"}},
		{"field", errs.Wrap(errs.Internal, errs.Field("ttl", "must be positive"), "create"),
			Error{Code: 400, Message: "create: ttl: must be positive", Field: "ttl", Reason: "invalid_argument"}},
		{"canceled", fmt.Errorf("exec: %w", context.Canceled),
			Error{Code: 503, Message: "exec: context canceled", Reason: "unavailable"}},
		{"plain", errors.New("boom"), Error{Code: 500, Message: "boom", Reason: "internal"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, tc.err)
			var got Error
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if rec.Code != tc.want.Code || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type req struct {
		Name  string            `json:"name"`
		TTL   string            `json:"ttl"`
		In    inner             `json:"in"`
		Extra map[string]string `json:"extra"`
		TTL2  duration.Duration `json:"ttl2"`
	}
	for _, tc := range []struct {
		name    string
		body    string
		lenient bool
		field   string // "" = no error
		want    req
	}{
		{"empty", "", false, "", req{}},
		{"blank", " \n\t", false, "", req{}},
		{"ok", `{"name":"a","in":{"n":3}}`, false, "", req{Name: "a", In: inner{N: 3}}},
		{"unknown field named", `{"name":"a","color":"red"}`, false, "color", req{}},
		{"unknown field lenient", `{"name":"a","color":"red"}`, true, "", req{Name: "a"}},
		{"wrong type named", `{"name":5}`, false, "name", req{}},
		{"wrong nested type named", `{"in":{"n":"x"}}`, false, "in.n", req{}},
		{"wrong type lenient still an error", `{"ttl":[1]}`, true, "ttl", req{}},
		{"duration", `{"ttl2":"1d12h"}`, false, "", req{TTL2: duration.Duration(36 * time.Hour)}},
		{"duration seconds", `{"ttl2":90}`, false, "", req{TTL2: duration.Duration(90 * time.Second)}},
		{"bad duration named", `{"ttl2":"soon"}`, false, "ttl2", req{}},
		{"bad nested duration named", `{"in":{"n":1},"ttl2":"-5m"}`, true, "ttl2", req{}},
		{"not an object", `[1,2]`, false, "body", req{}},
		{"syntax", `{"name":`, false, "body", req{}},
		{"too large", `{"name":"` + strings.Repeat("x", MaxBody) + `"}`, false, "body", req{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			var got req
			var err error
			if tc.lenient {
				err = DecodeLenient(r, &got)
			} else {
				err = Decode(r, &got)
			}
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("decoded (-want +got):\n%s", diff)
				}
				return
			}
			if strings.Contains(tc.name, "duration") && !strings.Contains(fmt.Sprint(err), "1d") {
				t.Errorf("a bad duration's message must list the forms: %v", err)
			}
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tc.field {
				t.Errorf("Decode = %v (kind %v, field %q), want InvalidArgument naming %q", err, errs.KindOf(err), errs.FieldOf(err), tc.field)
			}
		})
	}
}

func TestWriteJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteJSON(rec, 201, map[string]int{"a": 1})
	if rec.Code != 201 || rec.Body.String() != "{\"a\":1}\n" {
		t.Errorf("WriteJSON: %d %q", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	WriteJSONIndent(rec, 200, map[string]int{"a": 1})
	if rec.Body.String() != "{\n  \"a\": 1\n}\n" {
		t.Errorf("WriteJSONIndent: %q", rec.Body.String())
	}
}

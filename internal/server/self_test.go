package server

import (
	"testing"

	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
)

func TestSelfRoutesShape(t *testing.T) {
	if !selfRoutes["GET /v1/sandboxes/{id}"] {
		t.Fatal("a sandbox must be able to read its own info")
	}
	for pattern := range selfRoutes {
		if !selfPatternOK(pattern) {
			t.Errorf("selfRoutes entry %q: want \"METHOD /v1/sandboxes/{id}[/...]\"", pattern)
		}
	}
}

func TestCheckSelf(t *testing.T) {
	sb := daemon.Principal{Owner: "alice", Sandbox: "abc"}
	for _, tc := range []struct {
		name    string
		pattern string
		id      string
		p       daemon.Principal
		want    errs.Kind // 0: allowed
	}{
		{"rest key, any route", "POST /v1/sandboxes/{id}/exec", "zzz", daemon.Principal{Owner: "alice"}, 0},
		{"admin, any route", "DELETE /v1/sandboxes/{id}", "zzz", daemon.Principal{Owner: "admin", Admin: true}, 0},
		{"own info", "GET /v1/sandboxes/{id}", "abc", sb, 0},
		{"another sandbox's info", "GET /v1/sandboxes/{id}", "abd", sb, errs.PermissionDenied},
		{"empty id", "GET /v1/sandboxes/{id}", "", sb, errs.PermissionDenied},
		{"exec itself", "POST /v1/sandboxes/{id}/exec", "abc", sb, errs.PermissionDenied},
		{"delete itself", "DELETE /v1/sandboxes/{id}", "abc", sb, errs.PermissionDenied},
		{"secrets", "GET /v1/secrets", "", sb, errs.PermissionDenied},
		{"keys", "POST /v1/keys", "", sb, errs.PermissionDenied},
		{"list sandboxes", "GET /v1/sandboxes", "", sb, errs.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSelf(tc.pattern, tc.id, tc.p)
			if tc.want == 0 {
				if err != nil {
					t.Fatalf("checkSelf = %v, want allowed", err)
				}
				return
			}
			if errs.KindOf(err) != tc.want {
				t.Fatalf("checkSelf = %v (kind %v), want %v", err, errs.KindOf(err), tc.want)
			}
		})
	}
}

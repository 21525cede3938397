package e2b

import (
	"net/http/httptest"
	"testing"
)

func TestDecideRoute(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		target  string
		host    string
		headers map[string]string
		want    route
	}{
		{name: "sandbox header wins", method: "POST", target: "/process.Process/Start",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123", "X-Access-Token": "t"},
			want:    route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "code interpreter port by header", method: "POST", target: "/execute",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "49999"},
			want:    route{Dest: toPort, SandboxID: "abc123", Port: "49999"}},
		{name: "envd port by header is envd", method: "POST", target: "/process.Process/Start",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "49983"},
			want:    route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "bad port by header still goes to the port handler", method: "GET", target: "/",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "http"},
			want:    route{Dest: toPort, SandboxID: "abc123", Port: "http"}},
		{name: "shared /health with header is envd", method: "GET", target: "/health",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123"}, want: route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "shared /health without header is berth", method: "GET", target: "/health", want: route{Dest: toNext}},
		{name: "legacy client id suffix stripped", method: "GET", target: "/files?path=a",
			headers: map[string]string{"E2b-Sandbox-Id": "abc123-6532622b"}, want: route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "old SDK token only", method: "GET", target: "/files?path=a",
			headers: map[string]string{"X-Access-Token": "tok"}, want: route{Dest: toEnvd}},
		{name: "token with API key is control plane", method: "GET", target: "/v2/sandboxes",
			headers: map[string]string{"X-Access-Token": "tok", "X-API-KEY": "k"}, want: route{Dest: toControlPlane}},
		{name: "host routing", method: "POST", target: "/filesystem.Filesystem/Stat", host: "49983-abc123.berth.example:443",
			want: route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "host routing with client id", method: "GET", target: "/health", host: "49983-abc123-6532622b.berth.example",
			want: route{Dest: toEnvd, SandboxID: "abc123"}},
		{name: "user port host is not envd", method: "GET", target: "/", host: "8080-abc123.berth.example", want: route{Dest: toNext}},
		{name: "bad id in host", method: "GET", target: "/", host: "49983-ABC.berth.example", want: route{Dest: toNext}},
		{name: "v2 create", method: "POST", target: "/v2/sandboxes", want: route{Dest: toControlPlane}},
		{name: "v1 create", method: "POST", target: "/sandboxes", want: route{Dest: toControlPlane}},
		{name: "connect v2", method: "POST", target: "/v2/sandboxes/abc/connect", want: route{Dest: toControlPlane}},
		{name: "kill", method: "DELETE", target: "/sandboxes/abc", want: route{Dest: toControlPlane}},
		{name: "snapshots", method: "GET", target: "/snapshots", want: route{Dest: toControlPlane}},
		{name: "templates", method: "DELETE", target: "/templates/x", want: route{Dest: toControlPlane}},
		{name: "berth v1", method: "GET", target: "/v1/sandboxes", want: route{Dest: toNext}},
		{name: "prefix look-alike", method: "GET", target: "/sandboxesx", want: route{Dest: toNext}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.target, nil)
			r.Host = "127.0.0.1:3000"
			if tt.host != "" {
				r.Host = tt.host
			}
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			if got := decideRoute(r); got != tt.want {
				t.Errorf("decideRoute = %+v (%s), want %+v (%s)", got, got.Dest, tt.want, tt.want.Dest)
			}
		})
	}
}

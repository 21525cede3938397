//go:build linux && !clientonly

package main

import (
	"testing"

	"github.com/berth-dev/berth/internal/errs"
)

func TestHostnamesServeConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		in    HostnamesServeConfig
		field string // "" = valid
		want  HostnamesServeConfig
	}{
		{name: "off", in: HostnamesServeConfig{}},
		{name: "domain gets the default listener, normalized", in: HostnamesServeConfig{SandboxDomain: "Berth.Localhost."},
			want: HostnamesServeConfig{SandboxDomain: "berth.localhost", SandboxTLSListen: "127.0.0.1:443"}},
		{name: "listen without domain", in: HostnamesServeConfig{SandboxTLSListen: "127.0.0.1:8443"}, field: "sandbox_domain"},
		{name: "cert without domain", in: HostnamesServeConfig{SandboxTLSCert: "c.pem"}, field: "sandbox_domain"},
		{name: "bad domain", in: HostnamesServeConfig{SandboxDomain: "a..b"}, field: "sandbox_domain"},
		{name: "bad listen", in: HostnamesServeConfig{SandboxDomain: "x.localhost", SandboxTLSListen: "443"}, field: "sandbox_tls_listen"},
		{name: "cert without key", in: HostnamesServeConfig{SandboxDomain: "x.localhost", SandboxTLSCert: "c.pem"}, field: "sandbox_tls_cert"},
		{name: "operator certificate", in: HostnamesServeConfig{SandboxDomain: "x.example", SandboxTLSListen: "0.0.0.0:443", SandboxTLSCert: "c", SandboxTLSKey: "k"},
			want: HostnamesServeConfig{SandboxDomain: "x.example", SandboxTLSListen: "0.0.0.0:443", SandboxTLSCert: "c", SandboxTLSKey: "k"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.in
			err := c.Validate()
			if tt.field != "" {
				if errs.FieldOf(err) != tt.field {
					t.Fatalf("err = %v (field %q), want field %q", err, errs.FieldOf(err), tt.field)
				}
				return
			}
			if err != nil || c != tt.want {
				t.Fatalf("got %+v, %v; want %+v", c, err, tt.want)
			}
		})
	}
}

//go:build linux && !clientonly

package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/trace"
)

// TestOTLPEndpointPrecedence: --otlp-endpoint wins over
// OTEL_EXPORTER_OTLP_ENDPOINT, which applies without it; a bad value is
// refused naming otlp_endpoint before anything starts.
func TestOTLPEndpointPrecedence(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, env, flag, want string
	}{
		{"flag wins", "ftp://env-value", "flag-value:4318", `"flag-value:4318"`}, // both invalid: the message names the winner
		{"env without flag", "ftp://env", "", `"ftp://env"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(trace.EnvEndpoint, tc.env)
			args := []string{"--data-dir", dir}
			if tc.flag != "" {
				args = append(args, "--otlp-endpoint", tc.flag)
			}
			err := runServe(context.Background(), args, io.Discard)
			if errs.KindOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "otlp_endpoint") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want otlp_endpoint refused with %s", err, tc.want)
			}
		})
	}
	c := defaultServeConfig()
	t.Setenv(trace.EnvEndpoint, "http://127.0.0.1:4318")
	envOverride(&c)
	if c.OTLPEndpoint != "http://127.0.0.1:4318" {
		t.Errorf("env not applied: %q", c.OTLPEndpoint)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("valid endpoint refused: %v", err)
	}
}

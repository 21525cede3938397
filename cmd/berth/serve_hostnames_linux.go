//go:build linux && !clientonly

package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/sandboxca"
)

// HostnamesServeConfig is the sandbox host name part of `berth serve`'s
// config (https://<port>-<id>.<domain>, internal/e2b/hostnames.go),
// embedded in ServeConfig.
type HostnamesServeConfig struct {
	// SandboxDomain enables host names under it ("" = off).
	SandboxDomain string `json:"sandbox_domain,omitempty"`
	// SandboxTLSListen is the HTTPS listener for them; default
	// 127.0.0.1:443 (SDKs build https://<port>-<id>.<domain> without a port).
	SandboxTLSListen string `json:"sandbox_tls_listen,omitempty"`
	// SandboxTLSCert and SandboxTLSKey are an operator's certificate (PEM)
	// for *.<domain>, replacing berth's own CA (DATA_DIR/sandbox-ca).
	SandboxTLSCert string `json:"sandbox_tls_cert,omitempty"`
	SandboxTLSKey  string `json:"sandbox_tls_key,omitempty"`
}

func hostnameFlags(fs *flag.FlagSet) (apply func(*HostnamesServeConfig)) {
	var h HostnamesServeConfig
	fs.StringVar(&h.SandboxDomain, "sandbox-domain", "", "serve sandbox ports as https://<port>-<id>.DOMAIN (e.g. berth.localhost; E2B_DOMAIN for SDKs)")
	fs.StringVar(&h.SandboxTLSListen, "sandbox-tls-listen", "", "HTTPS listen address for sandbox host names (default 127.0.0.1:443)")
	fs.StringVar(&h.SandboxTLSCert, "sandbox-tls-cert", "", "PEM certificate for *.DOMAIN instead of berth's CA (`berth ca`)")
	fs.StringVar(&h.SandboxTLSKey, "sandbox-tls-key", "", "PEM key of --sandbox-tls-cert")
	return func(c *HostnamesServeConfig) {
		for p, v := range map[*string]string{&c.SandboxDomain: h.SandboxDomain, &c.SandboxTLSListen: h.SandboxTLSListen,
			&c.SandboxTLSCert: h.SandboxTLSCert, &c.SandboxTLSKey: h.SandboxTLSKey} {
			if v != "" {
				*p = v
			}
		}
	}
}

// Validate names the bad key and normalizes the domain.
func (c *HostnamesServeConfig) Validate() error {
	if c.SandboxDomain == "" {
		if c.SandboxTLSListen != "" || c.SandboxTLSCert != "" || c.SandboxTLSKey != "" {
			return errs.Field("sandbox_domain", "is required with sandbox_tls_listen, sandbox_tls_cert or sandbox_tls_key")
		}
		return nil
	}
	d, err := sandboxca.NormalizeDomain(c.SandboxDomain)
	if err != nil {
		return err
	}
	c.SandboxDomain = d
	if c.SandboxTLSListen == "" {
		c.SandboxTLSListen = "127.0.0.1:443"
	}
	if _, _, err := net.SplitHostPort(c.SandboxTLSListen); err != nil {
		return errs.Field("sandbox_tls_listen", "must be host:port, got %q", c.SandboxTLSListen)
	}
	if (c.SandboxTLSCert == "") != (c.SandboxTLSKey == "") {
		return errs.Field("sandbox_tls_cert", "sandbox_tls_cert and sandbox_tls_key go together")
	}
	return nil
}

// startSandboxTLS serves handler over HTTPS for the sandbox host names
// (SNI picks the certificate; a name outside the domain gets none). It
// returns a stop function; nil config is a no-op.
func startSandboxTLS(c HostnamesServeConfig, dataDir string, handler http.Handler, log *slog.Logger) (stop func(), err error) {
	if c.SandboxDomain == "" {
		return func() {}, nil
	}
	var is *sandboxca.Issuer
	if c.SandboxTLSCert != "" {
		is, err = sandboxca.Static(c.SandboxDomain, c.SandboxTLSCert, c.SandboxTLSKey)
	} else {
		var ca *sandboxca.CA
		if ca, err = sandboxca.LoadOrCreate(sandboxca.Dir(dataDir)); err == nil {
			is, err = sandboxca.NewIssuer(ca, c.SandboxDomain)
		}
	}
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", c.SandboxTLSListen)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "sandbox_tls_listen")
	}
	srv := &http.Server{Handler: handler, TLSConfig: is.TLSConfig(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)} // failed handshakes are the client's
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("sandbox TLS listener stopped", "err", err)
		}
	}()
	log.Info("serving sandbox host names", "listen", ln.Addr().String(), "domain", c.SandboxDomain)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

//go:build linux && !clientonly

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/berth-dev/berth/internal/cli"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/e2b"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/metering"
	"github.com/berth-dev/berth/internal/quota"
	"github.com/berth-dev/berth/internal/reaper"
	"github.com/berth-dev/berth/internal/runtime"
	"github.com/berth-dev/berth/internal/runtime/oci"
	"github.com/berth-dev/berth/internal/server"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/trace"
)

// ServeConfig is `berth serve`'s configuration: defaults, then the --config
// file (strict JSON: unknown keys are errors), then BERTH_* env, then flags.
type ServeConfig struct {
	DataDir         string `json:"data_dir"`
	Listen          string `json:"listen"`
	Runtime         string `json:"runtime"`
	DefaultTemplate string `json:"default_template"`
	BuildDefault    bool   `json:"build_default_template"`
	DefaultTTL      string `json:"default_ttl"`
	MaxTTL          string `json:"max_ttl"`
	CacheDir        string `json:"cache_dir"`
	RuncPath        string `json:"runc_path"`
	RunscPath       string `json:"runsc_path"`
	CriuPath        string `json:"criu_path"`
	AgentPath       string `json:"agent_path"`
	LogLevel        string `json:"log_level"`
	// OTLPEndpoint is the OTLP/HTTP collector spans are exported to
	// (internal/trace); "" (the default) turns tracing off.
	OTLPEndpoint string `json:"otlp_endpoint,omitempty"`
	CheckpointConfig
	// NoUserNS runs new runc sandboxes without a user namespace.
	NoUserNS bool `json:"no_userns,omitempty"`
	// ActivityRetention is how many activity entries each sandbox keeps.
	ActivityRetention int `json:"activity_retention,omitempty"`
	// WorkspaceSpares is how many formatted workspace images are kept ready
	// for cold creates; nil: daemon.DefaultWorkspaceSpares, 0: none.
	WorkspaceSpares *int `json:"workspace_spares,omitempty"`
	NetworkServeConfig
	HostnamesServeConfig
	// Reaper policies, per-owner quotas and prices (see internal/reaper,
	// internal/quota, internal/metering); zero values are the defaults.
	Reaper reaper.Config   `json:"reaper,omitzero"`
	Quotas quota.Config    `json:"quotas,omitzero"`
	Prices metering.Prices `json:"prices,omitzero"`
}

const defaultDataDir = "/var/lib/berth"

func defaultServeConfig() ServeConfig {
	return ServeConfig{
		DataDir: defaultDataDir, Listen: "127.0.0.1:7070", Runtime: "runc", DefaultTemplate: "default",
		BuildDefault: true, DefaultTTL: "15m", MaxTTL: "24h", CacheDir: "/var/cache/berth", LogLevel: "info",
	}
}

func loadConfigFile(path string, c *ServeConfig) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "config")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return errs.Field("config", "%s: %v", path, err)
	}
	return nil
}

// Validate names the bad key.
func (c *ServeConfig) Validate() error {
	if !filepath.IsAbs(c.DataDir) {
		return errs.Field("data_dir", "must be an absolute path, got %q", c.DataDir)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return errs.Field("listen", "must be host:port, got %q", c.Listen)
	}
	if c.Runtime != "runc" && c.Runtime != "runsc" {
		return errs.Field("runtime", "must be runc or runsc, got %q", c.Runtime)
	}
	for k, v := range map[string]string{"default_ttl": c.DefaultTTL, "max_ttl": c.MaxTTL} {
		if d, err := server.ParseDuration(v); err != nil || d <= 0 {
			return errs.Field(k, "must be a positive duration, got %q", v)
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return errs.Field("log_level", "must be debug, info, warn or error")
	}
	if c.OTLPEndpoint != "" {
		if _, err := trace.TracesURL("otlp_endpoint", c.OTLPEndpoint); err != nil {
			return err
		}
	}
	if err := c.CheckpointConfig.Validate(); err != nil {
		return err
	}
	if err := c.HostnamesServeConfig.Validate(); err != nil {
		return err
	}
	return c.NetworkServeConfig.Validate()
}

func envOverride(c *ServeConfig) {
	for k, p := range map[string]*string{
		"BERTH_DATA_DIR": &c.DataDir, "BERTH_LISTEN": &c.Listen, "BERTH_RUNTIME": &c.Runtime,
		"BERTH_CACHE_DIR": &c.CacheDir, "BERTH_RUNSC": &c.RunscPath, "BERTH_CRIU": &c.CriuPath,
		trace.EnvEndpoint: &c.OTLPEndpoint,
	} {
		if v := os.Getenv(k); v != "" {
			*p = v
		}
	}
}

// runServe is `berth serve`: config (defaults, file, env, flags) → store →
// runtimes → daemon → handlers. It is the composition root, and the only
// code of the binary that links the server.
func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	var cf ClusterFlags // --cluster (serve_cluster_linux.go)
	cfg, err := parseServe("serve", args, stderr, cf.flags)
	if err != nil {
		return err
	}
	if cf.Cluster {
		return serveCluster(ctx, cfg, cf, stderr)
	}
	return serve(ctx, cfg, stderr, serveHooks{})
}

// parseServe reads serve's configuration from args; more adds the flags of
// a command built on serve (`berth node`).
func parseServe(name string, args []string, stderr io.Writer, more func(*flag.FlagSet)) (ServeConfig, error) {
	cfg := defaultServeConfig()
	// The config file is applied before other flags, so find it first.
	pre := flag.NewFlagSet(name, flag.ContinueOnError)
	pre.SetOutput(stderr)
	cfgFile := pre.String("config", "", "JSON config file")
	dataDir := pre.String("data-dir", "", "state directory (default /var/lib/berth)")
	listen := pre.String("listen", "", "listen address (default 127.0.0.1:7070)")
	rt := pre.String("runtime", "", "default runtime: runc or runsc")
	noBuild := pre.Bool("no-default-template", false, "do not build the default template on start")
	logLevel := pre.String("log-level", "", "debug, info, warn, error")
	otlp := pre.String("otlp-endpoint", "", "export OpenTelemetry spans to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (default $"+trace.EnvEndpoint+"; unset: tracing off)")
	noUserNS := pre.Bool("no-userns", false, "run new runc sandboxes without a user namespace (root inside is root on the host)")
	activityRetention := pre.Int("activity-retention", 0, "activity entries kept per sandbox, oldest pruned (default 10000)")
	spares := pre.Int("workspace-spares", -1, fmt.Sprintf("formatted workspace images kept ready for cold creates (default %d; 0: none)", daemon.DefaultWorkspaceSpares))
	applyNetFlags := networkFlags(pre)
	applyHostFlags := hostnameFlags(pre)
	if more != nil {
		more(pre)
	}
	if err := pre.Parse(args); err != nil {
		return cfg, cli.UsageError(err.Error())
	}
	if *cfgFile != "" {
		if err := loadConfigFile(*cfgFile, &cfg); err != nil {
			return cfg, err
		}
	}
	envOverride(&cfg)
	for p, v := range map[*string]string{&cfg.DataDir: *dataDir, &cfg.Listen: *listen, &cfg.Runtime: *rt, &cfg.LogLevel: *logLevel, &cfg.OTLPEndpoint: *otlp} {
		if v != "" {
			*p = v
		}
	}
	applyNetFlags(&cfg.NetworkServeConfig)
	applyHostFlags(&cfg.HostnamesServeConfig)
	deriveNetwork(cfg.DataDir, &cfg.NetworkServeConfig)
	if *noBuild {
		cfg.BuildDefault = false
	}
	if *noUserNS {
		cfg.NoUserNS = true
	}
	if *activityRetention != 0 {
		cfg.ActivityRetention = *activityRetention
	}
	if cfg.ActivityRetention < 0 {
		return cfg, errs.Field("activity_retention", "must not be negative, got %d", cfg.ActivityRetention)
	}
	if *spares >= 0 {
		cfg.WorkspaceSpares = spares
	}
	if cfg.WorkspaceSpares != nil && *cfg.WorkspaceSpares < 0 {
		return cfg, errs.Field("workspace_spares", "must not be negative, got %d", *cfg.WorkspaceSpares)
	}
	return cfg, cfg.Validate()
}

// serveHooks are where a command built on serve (`berth node`,
// node_linux.go) adds to it; zero for `berth serve`.
type serveHooks struct {
	// wrapStore wraps the daemon's store before the daemon is built.
	wrapStore func(store.Store) store.Store
	// daemon edits the daemon's config.
	daemon func(*daemon.Config)
	// started runs once the daemon runs, before the listener opens, with
	// the HTTP surface; the stop it returns runs at shutdown, before the
	// daemon closes.
	started func(ctx context.Context, d *daemon.Daemon, handler http.Handler, log *slog.Logger) (stop func(), err error)
}

func lookBinary(explicit string, candidates ...string) string {
	if explicit != "" {
		return explicit
	}
	for _, c := range candidates {
		if filepath.IsAbs(c) {
			if st, err := os.Stat(c); err == nil && !st.IsDir() {
				return c
			}
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	return ""
}

func serve(ctx context.Context, cfg ServeConfig, logOut io.Writer, hooks serveHooks) error {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(trace.LogHandler(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl})))
	stopTracing, err := trace.Start(ctx, cfg.OTLPEndpoint)
	if err != nil {
		return err
	}
	defer func() { // last: the spans of the shutdown itself are flushed too
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(fctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}()
	if cfg.OTLPEndpoint != "" {
		u, _ := trace.TracesURL("otlp_endpoint", cfg.OTLPEndpoint)
		log.Info("tracing enabled", "otlp_endpoint", u)
	}
	self, _ := os.Executable()
	selfDir := filepath.Dir(self)
	agent := lookBinary(cfg.AgentPath, filepath.Join(selfDir, "berth-agent"))
	if agent == "" {
		return errs.Field("agent_path", "berth-agent not found beside %s; build with `go build -o DIR ./cmd/...`", self)
	}
	// The data dir holds the store, keys and every sandbox's content: root
	// only (existing installs made it 0711, hence the chmod). No umask:
	// files bind-mounted into sandboxes (resolv.conf, the agent) must stay
	// readable there.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "data_dir")
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "data_dir")
	}
	st, err := store.OpenSQLite(filepath.Join(cfg.DataDir, "berth.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	var dst store.Store = st
	if hooks.wrapStore != nil {
		dst = hooks.wrapStore(st)
	}
	tpl, err := template.Open(cfg.DataDir, log)
	if err != nil {
		return err
	}
	runtimes := map[string]runtime.Runtime{}
	var probed <-chan struct{}
	criu := lookBinary(cfg.CriuPath, filepath.Join(cfg.CacheDir, "bin", "criu"))
	if _, err := os.Stat(criu); criu != "" && err != nil {
		// Without CRIU, runc memory pauses fall back to disk (and say so).
		log.Warn("criu not found; runc memory checkpoints disabled", "criu_path", criu)
		criu = ""
	}
	if p := lookBinary(cfg.RuncPath, "runc"); p != "" {
		var userNS *runtime.IDMap // the trial checkpoint's container is mapped as the sandboxes are
		if !cfg.NoUserNS {
			m := daemon.RuncUserNS()
			userNS = &runtime.IDMap{HostID: m.HostID, Size: m.Size}
		}
		r, err := oci.New("runc", oci.Config{Binary: p, Root: filepath.Join(cfg.DataDir, "runtime", "runc"), CRIU: criu, Logger: log,
			ProbeCacheDir: cfg.CacheDir, TrustCRIU: cfg.TrustCRIU, ProbeTimeout: 2 * cfg.checkpointTimeout(), ProbeUserNS: userNS})
		if err != nil {
			return err
		}
		runtimes["runc"] = r
		probed = r.StartProbe(ctx)  // in the background; see the bounded wait before listening
		defer func() { <-probed }() // a trial cut short by shutdown removes its container first
	}
	if p := lookBinary(cfg.RunscPath, filepath.Join(selfDir, "runsc"), filepath.Join(cfg.CacheDir, "bin", "runsc"), "runsc"); p != "" {
		r, err := oci.New("runsc", oci.Config{Binary: p, Root: filepath.Join(cfg.DataDir, "runtime", "runsc"), Logger: log})
		if err != nil {
			return err
		}
		runtimes["runsc"] = r
	}
	if _, ok := runtimes[cfg.Runtime]; !ok {
		return errs.Field("runtime", "%s is not installed (run scripts/setup.sh)", cfg.Runtime)
	}
	defTTL, _ := server.ParseDuration(cfg.DefaultTTL)
	maxTTL, _ := server.ParseDuration(cfg.MaxTTL)
	dcfg := daemon.Config{
		DataDir: cfg.DataDir, DefaultRuntime: cfg.Runtime, DefaultTemplate: cfg.DefaultTemplate,
		DefaultTTL: defTTL, MaxTTL: maxTTL, AgentPath: agent, Log: log,
		Reaper: cfg.Reaper, Quotas: cfg.Quotas, Prices: cfg.Prices, NoUserNS: cfg.NoUserNS,
		ActivityRetention: cfg.ActivityRetention, WorkspaceSpares: daemonSpares(cfg.WorkspaceSpares),
		CheckpointTimeout: cfg.checkpointTimeout(), CheckpointTimeoutPerGiB: cfg.checkpointTimeoutPerGiB(),
	}
	if hooks.daemon != nil {
		hooks.daemon(&dcfg)
	}
	d, err := daemon.New(dcfg, dst, runtimes, tpl)
	if err != nil {
		return err
	}
	defer d.Close()
	if _, err := d.Auth().EnsureAdminKey(ctx); err != nil {
		return err
	}
	if err := startNetwork(ctx, d, cfg.NetworkServeConfig); err != nil {
		return err
	}
	if err := d.Reconcile(ctx); err != nil {
		log.Error("reconcile found problems", "err", err)
	}
	if cfg.BuildDefault {
		d.Templates().EnsureDefault(filepath.Join(cfg.CacheDir, "rootfs"))
	}
	d.Run()

	waitProbe(probed, log)
	handler := trace.Handler(routes(d, log, cfg.SandboxDomain)) // a span per request when tracing is on
	if hooks.started != nil {
		stop, err := hooks.started(ctx, d, handler, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errs.Wrap(errs.Unavailable, err, "listen")
	}
	stopTLS, err := startSandboxTLS(cfg.HostnamesServeConfig, cfg.DataDir, handler, log)
	if err != nil {
		return err
	}
	defer stopTLS()
	// WriteTimeout stays 0: exec and watch streams are long-lived.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Info("berth serving", "listen", ln.Addr().String(), "data_dir", cfg.DataDir, "runtime", cfg.Runtime)
	fmt.Fprintf(logOut, "berth is listening on http://%s (admin key in %s)\n", ln.Addr(), filepath.Join(cfg.DataDir, "admin.key"))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	// Graceful: stop accepting, let short requests finish; sandboxes keep running.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	log.Info("berth stopped; sandboxes keep running")
	return nil
}

// routes assembles the HTTP surface on one listener.
// The E2B surface sits in front of /v1: requests for a sandbox's envd
// (routing headers, access token, or Host) and E2B control-plane paths go
// to it, everything else to berth's own API.
// With a sandbox domain, "<port>-<id>.<domain>" names sandbox ports.
func routes(d *daemon.Daemon, log *slog.Logger, sandboxDomain string) http.Handler {
	rest := server.New(d, log)
	d.SelfAPI().SetHandler(rest) // the in-sandbox API serves /v1 as the sandbox (internal/server/self.go)
	// Forged cluster headers are refused on every route (auth/cluster.go).
	return d.Auth().ClusterGate(e2b.New(d, log, e2b.Options{DialPort: d.Net().DialPort, Domain: sandboxDomain}).Handler(rest))
}

// daemonSpares maps serve's workspace_spares (nil: default, 0: none) to
// daemon.Config's (0: default, negative: none).
func daemonSpares(n *int) int {
	switch {
	case n == nil:
		return 0
	case *n == 0:
		return -1
	}
	return *n
}

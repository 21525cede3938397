//go:build linux && !clientonly

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/cluster/api"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/server"
	"github.com/berth-dev/berth/internal/trace"
)

// ClusterFlags are `berth serve --cluster`'s own settings.
type ClusterFlags struct {
	Cluster    bool
	Kubeconfig string
	Namespace  string
	QueueWait  time.Duration
}

// flags adds them to serve's flag set.
func (cf *ClusterFlags) flags(fs *flag.FlagSet) {
	fs.BoolVar(&cf.Cluster, "cluster", false, "run as a stateless cluster API replica over the Kubernetes store (docs/CLUSTER.md)")
	fs.StringVar(&cf.Kubeconfig, "kubeconfig", "", "with --cluster: kubeconfig (default $KUBECONFIG, ~/.kube/config, in-cluster)")
	fs.StringVar(&cf.Namespace, "namespace", "", "with --cluster: the namespace of berth's objects (default the kubeconfig's)")
	fs.DurationVar(&cf.QueueWait, "queue-wait", 0, "with --cluster: how long a create that fits on no node waits for room as a pending Sandbox (0: refused at once with 429)")
}

// serveCluster is `berth serve --cluster`: a stateless API replica
// (internal/cluster/api) over the Kubernetes store. It has no runtime and
// no sandbox state of its own; DATA_DIR holds only admin.key, the admin
// key this replica made (keys live in the store, so any replica's admin
// key works on every replica).
func serveCluster(ctx context.Context, cfg ServeConfig, cf ClusterFlags, logOut io.Writer) error {
	if cf.QueueWait < 0 {
		return errs.Field("queue-wait", "must not be negative, got %s", cf.QueueWait)
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(trace.LogHandler(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl})))
	kcfg, err := kube.LoadConfig(cf.Kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kube.New(kcfg)
	if err != nil {
		return err
	}
	ns := cf.Namespace
	if ns == "" {
		ns = kc.Namespace()
	}
	st, err := kubestore.Open(ctx, kc, ns)
	if err != nil {
		return err
	}
	defer st.Close()
	token, err := peer.EnsureToken(ctx, kc, ns)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "data_dir")
	}
	// The replica derives no envd tokens (the nodes do, with their own
	// token keys): its auth service only checks API keys.
	au := auth.New(st, cfg.DataDir, nil, nil)
	if _, err := au.EnsureAdminKey(ctx); err != nil {
		return err
	}
	defTTL, _ := server.ParseDuration(cfg.DefaultTTL)
	rep, err := api.New(api.Config{Kube: kc, Namespace: ns, Store: st, Token: token, Auth: au, Log: log,
		Domain: cfg.SandboxDomain, DefaultTemplate: cfg.DefaultTemplate, DefaultTTL: defTTL, QueueWait: cf.QueueWait})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errs.Wrap(errs.Unavailable, err, "listen")
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { rep.Run(rctx) })
	defer func() { stop(); wg.Wait() }()
	// WriteTimeout stays 0: exec and watch streams pass through.
	srv := &http.Server{Handler: trace.Handler(rep.Handler()), ReadHeaderTimeout: 10 * time.Second}
	log.Info("berth cluster replica serving", "listen", ln.Addr().String(), "namespace", ns, "server", kcfg.Server)
	fmt.Fprintf(logOut, "berth (cluster replica, namespace %s) is listening on http://%s (admin key in %s)\n", ns, ln.Addr(), filepath.Join(cfg.DataDir, "admin.key"))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	log.Info("berth cluster replica stopped")
	return nil
}

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
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/cli"
	"github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/store"
)

const nodeUsage = "node [--kubeconfig F] [--namespace NS] [--name N] [--peer-listen ADDR] [--advertise HOST:PORT] [--lease-duration D] [--adopt-grace D] [every serve flag]   " +
	"(Linux only: a berth daemon that is one node of a cluster, docs/CLUSTER.md)"

// nodeFlags are what `berth node` adds to serve's flags.
type nodeFlags struct {
	kubeconfig, namespace, name, peerListen, advertise string
	leaseDuration, adoptGrace                          time.Duration
}

func (f *nodeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, then in-cluster)")
	fs.StringVar(&f.namespace, "namespace", "", "namespace of the cluster's objects (default the kubeconfig's, else berth)")
	fs.StringVar(&f.name, "name", "", "this node's Node name (default the host name)")
	fs.StringVar(&f.peerListen, "peer-listen", "0.0.0.0:7443", "TLS listener API replicas reach this node on")
	fs.StringVar(&f.advertise, "advertise", "", "host:port put in the Node for replicas (default the first non-loopback IP and the peer port)")
	fs.DurationVar(&f.leaseDuration, "lease-duration", 40*time.Second, "the node Lease's duration; renewed every quarter of it")
	fs.DurationVar(&f.adoptGrace, "adopt-grace", 2*time.Minute, "how long a sandbox made for a replica's warm create or fork may wait for its Sandbox object before it is deleted")
}

// nodeNameRe is a DNS-1123 label (a Node's and a Lease's name part).
var nodeNameRe = lazyregexp.New(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// runNode is `berth node`: serve's daemon on this host (its own SQLite:
// the machine's journal), its HTTP surface also on the peer listener over
// TLS for the cluster's replicas, and the node agent (internal/cluster/node).
func runNode(ctx context.Context, args []string, stderr io.Writer) error {
	var nf nodeFlags
	cfg, err := parseServe("node", args, stderr, nf.register)
	if err != nil {
		return err
	}
	if nf.leaseDuration < 4*time.Second {
		return errs.Field("lease-duration", "must be at least 4s, got %s", nf.leaseDuration)
	}
	if nf.adoptGrace < time.Second {
		return errs.Field("adopt-grace", "must be at least 1s, got %s", nf.adoptGrace)
	}
	peerHost, peerPort, err := net.SplitHostPort(nf.peerListen)
	if err != nil {
		return errs.Field("peer-listen", "must be host:port, got %q", nf.peerListen)
	}
	if nf.name == "" {
		h, err := os.Hostname()
		if err != nil {
			return errs.Field("name", "not given and the host name is unknown: %v", err)
		}
		nf.name = strings.ToLower(strings.SplitN(h, ".", 2)[0])
	}
	if !nodeNameRe.MatchString(nf.name) {
		return errs.Field("name", "must be a DNS label (lowercase letters, digits, '-', at most 63), got %q", nf.name)
	}
	if nf.advertise == "" {
		ip := firstIP()
		if ip == "" {
			return errs.Field("advertise", "not given and this host has no non-loopback address")
		}
		nf.advertise = net.JoinHostPort(ip, peerPort)
	}
	advHost, _, err := net.SplitHostPort(nf.advertise)
	if err != nil {
		return errs.Field("advertise", "must be host:port, got %q", nf.advertise)
	}
	kcfg, err := kube.LoadConfig(nf.kubeconfig)
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "kubeconfig")
	}
	if nf.namespace == "" {
		nf.namespace = kcfg.Namespace
	}
	if nf.namespace == "" {
		nf.namespace = "berth"
	}
	kc, err := kube.New(kcfg)
	if err != nil {
		return err
	}
	token, err := peer.EnsureToken(ctx, kc, nf.namespace)
	if err != nil {
		return err
	}
	ks, err := kubestore.Open(ctx, kc, nf.namespace)
	if err != nil {
		return err
	}
	var cluster node.Cluster = ks
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "data_dir")
	}
	id, err := peer.LoadOrCreateIdentity(filepath.Join(cfg.DataDir, "peer"), []string{advHost, nf.name, peerHost})
	if err != nil {
		return err
	}
	var local *node.LocalStore
	hooks := serveHooks{
		wrapStore: func(st store.Store) store.Store {
			local = node.NewLocalStore(st)
			return local
		},
		daemon: func(c *daemon.Config) { c.ClusterToken, c.ClusterNode = token, nf.name },
		started: func(ctx context.Context, d *daemon.Daemon, handler http.Handler, log *slog.Logger) (func(), error) {
			return startNode(ctx, nf, id, d, local, cluster, kc, handler, log, stderr)
		},
	}
	return serve(ctx, cfg, stderr, hooks)
}

// startNode opens the peer listener and starts the agent; stop ends both.
func startNode(ctx context.Context, nf nodeFlags, id peer.Identity, d *daemon.Daemon, local *node.LocalStore,
	cluster node.Cluster, kc *kube.Client, handler http.Handler, log *slog.Logger, out io.Writer) (func(), error) {
	ag, err := node.New(node.Config{Kube: kc, Namespace: nf.namespace, Name: nf.name, Daemon: d, Local: local,
		Cluster: cluster, Address: "https://" + nf.advertise, CertSHA256: id.SHA256, LeaseDuration: nf.leaseDuration,
		AdoptGrace: nf.adoptGrace, Version: cli.Version, Log: log})
	if err != nil {
		return nil, err
	}
	if err := ag.Register(ctx); err != nil {
		return nil, errs.Wrap(errs.KindOf(err), err, "register node %s", nf.name)
	}
	ln, err := net.Listen("tcp", nf.peerListen)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, err, "peer-listen")
	}
	// Replicas' requests, each signed with the cluster token (auth's
	// cluster principal); WriteTimeout 0: exec and watch streams.
	// The layer endpoint (other nodes fetching templates) goes first; a
	// forwarded create fetches its template's layers before its route runs.
	srv := &http.Server{Handler: node.PeerHandler(d, d.Config().ClusterToken, ag.Prefetch(handler)), TLSConfig: id.ServerTLS(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("peer listener", "err", err)
		}
	}()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); ag.Run(actx) }()
	log.Info("berth node registered", "node", nf.name, "namespace", nf.namespace, "peer_listen", ln.Addr().String(),
		"advertise", nf.advertise, "cert_sha256", id.SHA256)
	fmt.Fprintf(out, "berth node %s: peers on https://%s (advertised https://%s)\n", nf.name, ln.Addr(), nf.advertise)
	return func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
		cancel()
		<-done
	}, nil
}

// firstIP is the first non-loopback unicast address of this host, IPv4 first.
func firstIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	var v6 string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || !ipn.IP.IsGlobalUnicast() {
			continue
		}
		if ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
		if v6 == "" {
			v6 = ipn.IP.String()
		}
	}
	return v6
}

// Package kubetest runs a real etcd and kube-apiserver on loopback for
// tests (the binaries scripts/kube-assets.sh builds from the Go module
// proxy), with berth's CRDs installed. No kubelet, scheduler or
// controller-manager: berth's node agent is its own kubelet, and nothing
// here relies on garbage collection.
//
// One server per test package (TestMain: kubetest.Main), a namespace per
// test (Server.Namespace): starting one takes ~4 s and ~330 MiB.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
)

// Versions of the assets scripts/kube-assets.sh builds by default.
const (
	K8sVersion  = "v1.37.2"
	EtcdVersion = "v3.7.3"
)

// AdminToken authenticates as system:masters.
const AdminToken = "berth-test-admin-token"

// Assets is the directory with kube-apiserver, etcd and kubectl:
// $BERTH_KUBE_ASSETS, else the script's cache under /var/cache/berth.
func Assets() (string, error) {
	dir := os.Getenv("BERTH_KUBE_ASSETS")
	if dir == "" {
		cache := os.Getenv("BERTH_CACHE_DIR")
		if cache == "" {
			cache = "/var/cache/berth"
		}
		dir = filepath.Join(cache, "kube", "k8s-"+K8sVersion+"-etcd-"+EtcdVersion)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			return "", errs.E(errs.FailedPrecondition, "%s not in %s: run scripts/kube-assets.sh", b, dir)
		}
	}
	return dir, nil
}

// Server is a running etcd + kube-apiserver.
type Server struct {
	Config kube.Config
	Client *kube.Client
	Assets string
	dir    string
	procs  []*exec.Cmd
	logs   []*bytes.Buffer
	// Tokens maps extra bearer tokens to their user (TokenUser).
	tokens map[string]TokenUser
}

// TokenUser is a user of the static token file.
type TokenUser struct {
	Name   string
	UID    string
	Groups []string
}

// Options for Start.
type Options struct {
	// CRDDir holds the CRDs to install (default: deploy/crds of the module).
	CRDDir string
	// Tokens are extra users (for RBAC tests), by token.
	Tokens map[string]TokenUser
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RepoRoot finds the module root (the directory holding go.mod) above
// this package's source.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return dir
}

// Start starts etcd and kube-apiserver in a new temporary directory and
// installs the CRDs. Stop ends them and removes the directory.
func Start(opts Options) (_ *Server, err error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "berth-kube-")
	if err != nil {
		return nil, err
	}
	s := &Server{Assets: assets, dir: dir, tokens: opts.Tokens}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	client, peer, secure := ports[0], ports[1], ports[2]
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	s.start(filepath.Join(assets, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"), "--name", "default",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peer),
		"--unsafe-no-fsync=true", "--log-level", "warn")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	saPub, saKey := filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	var tokens strings.Builder
	fmt.Fprintf(&tokens, "%s,admin,uid-admin,\"system:masters\"\n", AdminToken)
	for tok, u := range opts.Tokens {
		fmt.Fprintf(&tokens, "%s,%s,%s,\"%s\"\n", tok, u.Name, u.UID, strings.Join(u.Groups, ","))
	}
	tokFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokFile, []byte(tokens.String()), 0o600); err != nil {
		return nil, err
	}
	s.start(filepath.Join(assets, "kube-apiserver"),
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(secure),
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
		"--cert-dir", filepath.Join(dir, "certs"), "--token-auth-file", tokFile,
		"--authorization-mode", "RBAC", "--anonymous-auth=false",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.0.0.0/24", "--disable-admission-plugins", "ServiceAccount",
		// As every real cluster's (kubeadm, kind, managed ones): berth's
		// node DaemonSet is privileged, and its dry run must be judged so.
		"--allow-privileged=true")
	s.Config = kube.Config{Server: fmt.Sprintf("https://127.0.0.1:%d", secure), Token: AdminToken, Insecure: true, Namespace: "default"}
	if s.Client, err = kube.New(s.Config); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	crds := opts.CRDDir
	if crds == "" {
		crds = filepath.Join(RepoRoot(), "deploy", "crds")
	}
	if err := InstallCRDs(ctx, s.Client, crds); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start(bin string, args ...string) {
	cmd := exec.Command(bin, args...)
	buf := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &limited{buf, 1 << 20}, &limited{buf, 1 << 20}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		buf.WriteString(err.Error())
	}
	s.procs = append(s.procs, cmd)
	s.logs = append(s.logs, buf)
}

type limited struct {
	b *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if l.b.Len() < l.n {
		l.b.Write(p[:min(len(p), l.n-l.b.Len())])
	}
	return len(p), nil
}

func (s *Server) waitReady(ctx context.Context) error {
	for {
		err := s.Client.Do(ctx, http.MethodGet, "/readyz", nil, nil, nil)
		if err == nil {
			return nil
		}
		for i, p := range s.procs {
			if p.ProcessState != nil || (p.Process == nil) {
				return errs.E(errs.Unavailable, "%s did not start: %s", filepath.Base(p.Path), tail(s.logs[i]))
			}
		}
		select {
		case <-ctx.Done():
			return errs.E(errs.Unavailable, "kube-apiserver not ready: %v\netcd: %s\nkube-apiserver: %s", err, tail(s.logs[0]), tail(s.logs[len(s.logs)-1]))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(b *bytes.Buffer) string {
	s := b.String()
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}

// Logs returns the end of etcd's and kube-apiserver's output.
func (s *Server) Logs() string {
	var out strings.Builder
	for i, p := range s.procs {
		fmt.Fprintf(&out, "== %s\n%s\n", filepath.Base(p.Path), tail(s.logs[i]))
	}
	return out.String()
}

// Stop kills both and removes the directory.
func (s *Server) Stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		if p.Process != nil {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
	}
	_ = os.RemoveAll(s.dir)
}

// Kubeconfig writes a kubeconfig for the admin (or token's user) to a file
// under t.TempDir and returns its path.
func (s *Server) Kubeconfig(t testing.TB, token, namespace string) string {
	t.Helper()
	cfg := s.Config
	if token != "" {
		cfg.Token = token
	}
	cfg.Namespace = namespace
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, cfg.Kubeconfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Namespace creates a fresh namespace for the test (its objects are left
// behind at the end: without a controller-manager a namespace's deletion
// never finishes, and the server goes away with the package).
func (s *Server) Namespace(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "t-" + hex.EncodeToString(b)
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}
	if err := s.Client.Create(context.Background(), kube.Namespaces, "", ns, nil); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return name
}

// Main is TestMain for a package whose tests need the server: it starts
// one, hands it to set, runs the tests and stops it. Without the assets the
// tests are skipped, or fail under CI=true (a CI that cannot run them must
// say so).
func Main(m *testing.M, set func(*Server)) {
	s, err := Start(Options{})
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "kubetest:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "kubetest: skipping, no API server:", err)
		os.Exit(0)
	}
	set(s)
	code := m.Run()
	s.Stop()
	os.Exit(code)
}

// Package cluster is berth's cluster end-to-end test: a real etcd and
// kube-apiserver (internal/kube/kubetest) with berth's CRDs and RBAC, three
// real `berth node` processes running real runc sandboxes on this host, and
// two stateless `berth serve --cluster` replicas in front of them. It needs
// root, runc and the Kubernetes test assets (scripts/kube-assets.sh); it
// skips without them, and fails instead under CI=true.
package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/testutil"
)

var srv *kubetest.Server

// The namespace of deploy/'s manifests, and static tokens for the users the
// service accounts' tokens name: the processes run with exactly the RBAC
// deploy/10-rbac.yaml grants.
const (
	ns        = "berth"
	nodeToken = "berth-cluster-test-node"
	apiToken  = "berth-cluster-test-api"
)

func saUser(name string) kubetest.TokenUser {
	return kubetest.TokenUser{Name: "system:serviceaccount:" + ns + ":" + name, UID: "uid-" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
}

func TestMain(m *testing.M) {
	s, err := kubetest.Start(kubetest.Options{Tokens: map[string]kubetest.TokenUser{
		nodeToken: saUser("berth-node"), apiToken: saUser("berth-api"),
	}})
	if err != nil {
		if testutil.CI() {
			fmt.Fprintln(os.Stderr, "cluster:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "cluster: skipping, no API server:", err)
		os.Exit(0)
	}
	srv = s
	code := m.Run()
	s.Stop()
	testutil.RemoveBinaries()
	if tinyOnce.path != "" {
		_ = os.RemoveAll(filepath.Dir(tinyOnce.path))
	}
	os.Exit(code)
}

// proc is one berth process (a node or a replica).
type proc struct {
	t       *testing.T
	name    string
	bin     string
	args    []string
	dataDir string
	url     string // its plain-HTTP listener
	key     string // admin key from its data dir
	cmd     *exec.Cmd
	log     *lockedBuffer
	done    chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 4<<20 { // bounded: a chatty process must not eat the host's memory
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// shortDir is a data dir under /tmp: agent socket paths must fit in 107
// bytes. 0711: runc sandboxes in a user namespace reach their root
// filesystem below it as an unprivileged host uid.
func shortDir(t *testing.T, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

// start runs the process and waits until GET /v1/health answers and its
// admin key is in the data dir.
func (p *proc) start() {
	p.t.Helper()
	if p.log == nil { // a restart appends to the same log
		p.log = &lockedBuffer{}
	}
	p.cmd = exec.Command(filepath.Join(p.bin, "berth"), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	// Its own process group, so a SIGKILL of the node is of the node only
	// (its sandboxes are runc's, not its children's, and keep running).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
	exited := false
	err := testutil.Within(90 * time.Second).Every(100 * time.Millisecond).Until(func() error {
		if exited {
			return nil // reported below; no point waiting out the timeout
		}
		select {
		case <-p.done:
			exited = true
			return nil
		default:
		}
		resp, err := http.Get(p.url + "/v1/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health: %s", resp.Status)
		}
		b, err := os.ReadFile(filepath.Join(p.dataDir, "admin.key"))
		if err != nil {
			return err
		}
		p.key = strings.TrimSpace(string(b))
		return nil
	})
	if exited {
		p.t.Fatalf("%s exited at start (%v):\n%s", p.name, p.cmd.ProcessState, p.tail())
	}
	if err != nil {
		p.t.Fatalf("%s did not come up: %v\n%s", p.name, err, p.tail())
	}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return p.cmd != nil
	}
}

// kill9 kills it with no chance to clean up (a node's crash).
func (p *proc) kill9() {
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) stop() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill9()
	}
}

func (p *proc) tail() string {
	s := p.log.String()
	if len(s) > 6000 {
		s = "...\n" + s[len(s)-6000:]
	}
	return s
}

// client is a REST client of the process with key.
func (p *proc) client(key string) *client.Client {
	return client.New(p.url, key, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Minute}))
}

// cli runs the berth CLI against the process as its admin.
func (p *proc) cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "berth"), args...)
	cmd.Env = append(os.Environ(), "BERTH_URL="+p.url, "BERTH_API_KEY="+p.key)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// node is one `berth node`.
type node struct {
	proc
	peer    string
	netArgs []string
}

// nodeArgs are the node's flags: its own data dir, listeners and network
// (bridge, nftables table, veth prefix, /24), a short lease so a killed
// node is noticed within seconds.
func (n *node) setArgs(kubeconfig string) {
	n.args = append([]string{"node", "--kubeconfig", kubeconfig, "--namespace", ns, "--name", n.name,
		"--data-dir", n.dataDir, "--listen", strings.TrimPrefix(n.url, "http://"), "--peer-listen", n.peer,
		"--advertise", n.peer, "--lease-duration", leaseDuration.String(), "--no-default-template"}, n.netArgs...)
}

const leaseDuration = 6 * time.Second

// runtimeContainers lists the runc containers under the node's data dir
// (none before runc made its root). runc list can fail while a container
// is being deleted under it: callers waiting for a state retry on error.
func (n *node) runtimeContainers() ([]string, error) {
	root := filepath.Join(n.dataDir, "runtime", "runc")
	if _, err := os.Stat(root); err != nil {
		return nil, nil
	}
	var stderr strings.Builder
	cmd := exec.Command("runc", "--root", root, "list", "-q")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runc list on %s: %v: %s", n.name, err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// cleanup stops the node and checks its data dir. A test that passed
// deleted every sandbox and stopped the node gracefully, whose Close
// finishes the teardowns still under way: anything of the host left under
// the data dir then is a leak and fails the test. After a failure (or a
// SIGKILL the test did not follow up) sandboxes legitimately outlive the
// node: their containers and mounts are removed so a shared host does not
// keep them, and only what even that leaves fails the test.
func (n *node) cleanup(t *testing.T) {
	n.stop()
	if t.Failed() {
		t.Logf("== %s log:\n%s", n.name, n.tail())
	} else if leaks, err := testutil.HostLeaks(n.dataDir); err != nil || len(leaks) > 0 {
		t.Errorf("%s left under %s after a passing test and a graceful stop (%v):\n  %s",
			n.name, n.dataDir, err, strings.Join(leaks, "\n  "))
	}
	root := filepath.Join(n.dataDir, "runtime", "runc")
	ctrs, _ := n.runtimeContainers()
	for _, c := range ctrs {
		_ = exec.Command("runc", "--root", root, "delete", "--force", c).Run()
	}
	ms, _ := testutil.MountsUnder(n.dataDir)
	for i := len(ms) - 1; i >= 0; i-- {
		_ = syscall.Unmount(ms[i], syscall.MNT_DETACH)
	}
	testutil.RemoveAllChecked(t, n.dataDir)
}

// testNetwork gives a node its own bridge, table, veth prefix and a /24
// the host does not use, and removes them at the end.
func testNetwork(t *testing.T) []string {
	t.Helper()
	var rb [5]byte
	_, _ = rand.Read(rb[:])
	sfx := hex.EncodeToString(rb[:3])
	name := "bk" + sfx
	subnet := ""
	for i := 0; i < 64 && subnet == ""; i++ {
		_, _ = rand.Read(rb[3:])
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 232 + rb[3]%16, rb[4], 0}), 24)
		if !hostUses(p) {
			subnet = p.String()
		}
	}
	if subnet == "" {
		t.Fatal("no free /24 in 10.232.0.0/12 for a node's network")
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", "dev", name).Run()
		_ = exec.Command("nft", "delete", "table", "inet", name).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", name).Run()
	})
	return []string{"--network-bridge", name, "--network-table", name, "--network-veth-prefix", "k" + sfx[:3],
		"--network-subnet", subnet}
}

func hostUses(p netip.Prefix) bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Overlaps(p) {
			return true
		}
	}
	return false
}

var tinyOnce struct {
	sync.Once
	path string
	err  error
}

// tinyTar is the busybox "tiny" template as a tarball, built once.
func tinyTar(t *testing.T) string {
	t.Helper()
	tinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berth-tiny-")
		if err != nil {
			tinyOnce.err = err
			return
		}
		root := filepath.Join(dir, "rootfs")
		if err := rootfs.BusyboxRootFS(root); err != nil {
			tinyOnce.err = err
			return
		}
		tinyOnce.path = filepath.Join(dir, "tiny.tar")
		if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", tinyOnce.path, ".").CombinedOutput(); err != nil {
			tinyOnce.err = fmt.Errorf("tar: %v: %s", err, out)
		}
	})
	if tinyOnce.err != nil {
		t.Fatalf("tiny template: %v", tinyOnce.err)
	}
	return tinyOnce.path
}

// kubeAs is a client of the test API server as token's user.
func kubeAs(t *testing.T, token string) *kube.Client {
	t.Helper()
	cfg := srv.Config
	cfg.Token, cfg.Namespace = token, ns
	kc, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// run is exec through c: the command's stdout, its exit code.
func run(ctx context.Context, c *client.Client, id string, cmd ...string) (string, int, error) {
	var out, errb bytes.Buffer
	code, err := c.Sandbox(id).Run(ctx, execReq(cmd...), &out, &errb)
	if err != nil {
		return "", 0, fmt.Errorf("exec in %s: %w (stderr %q)", id, err, errb.String())
	}
	if code != 0 {
		return out.String(), code, fmt.Errorf("exec %q in %s: exit %d, stderr %q", cmd, id, code, errb.String())
	}
	return out.String(), code, nil
}

package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/testutil"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestBerthNodeBinary runs the real `berth node` (namespace from the
// kubeconfig): it registers its Node with the advertised address and its
// certificate's hash, publishes an imported template, serves the daemon's
// surface on the pinned TLS peer listener (a replica's signed create makes
// the sandbox with the replica's id, mirrored into its object; an unsigned
// request without a key is refused), and stops on SIGTERM.
func TestBerthNodeBinary(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	ctx := t.Context()
	ns := srv.Namespace(t)
	kcfg := srv.Kubeconfig(t, "", ns)
	dataDir, err := os.MkdirTemp("", "bn")
	if err != nil {
		t.Fatal(err)
	}
	// Last, after the process is gone: SIGTERM's Close finishes the
	// teardown of the sandbox deleted below (at most its drain bound).
	defer testutil.RemoveAllChecked(t, dataDir)
	listen, peerAddr := freeAddr(t), freeAddr(t)
	logs := &lockedWriter{}
	cmd := exec.Command(filepath.Join(bin, "berth"), "node", "--kubeconfig", kcfg, "--name", "bin1",
		"--data-dir", dataDir, "--listen", listen, "--peer-listen", peerAddr, "--advertise", peerAddr,
		"--lease-duration", "4s", "--no-default-template", "--no-network")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("berth node:\n%s", logs.String())
		}
	}()

	var n berthv1.Node
	// The Node is created first and its status written after (the status
	// subresource is a second call): wait for the status, not the object.
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		if err := srv.Client.Get(ctx, berthv1.Nodes, ns, "bin1", &n); err != nil {
			return err
		}
		if n.Status.Address == "" {
			return fmt.Errorf("node status not written yet")
		}
		return nil
	})
	if n.Status.Address != "https://"+peerAddr || len(n.Status.CertSHA256) != 64 || n.Status.Capacity.CPUMillis == 0 {
		t.Fatalf("node status %+v", n.Status)
	}
	var l kube.Lease
	if err := srv.Client.Get(ctx, kube.Leases, ns, berthv1.NodeLeaseName("bin1"), &l); err != nil || *l.Spec.HolderIdentity != "bin1" {
		t.Fatalf("lease %+v, %v", l.Spec, err)
	}

	// The local admin on --listen, as with berth serve.
	var key []byte
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		key, err = os.ReadFile(filepath.Join(dataDir, "admin.key"))
		return err
	})
	imp := exec.Command(filepath.Join(bin, "berth"), "template", "import", "tiny", tinyTar(t))
	imp.Env = append(os.Environ(), "BERTH_URL=http://"+listen, "BERTH_API_KEY="+strings.TrimSpace(string(key)))
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("template import: %v: %s", err, out)
	}
	ks, err := kubestore.Open(ctx, srv.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		_, err := ks.GetTemplate(ctx, "tiny")
		return err
	})

	// A replica's create through the pinned peer listener.
	token, err := peer.EnsureToken(ctx, srv.Client, ns) // the node made it; this reads it
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: peer.Transport(n.Status.CertSHA256), Timeout: 60 * time.Second}
	do := func(method, path string, sign bool, id string, body any) (int, []byte) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, n.Status.Address+path, rd)
		if sign {
			peer.Sign(req, token, peer.Principal{Owner: "carol"})
		}
		if id != "" {
			req.Header.Set(peer.HeaderSandboxID, id)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	if code, out := do("GET", "/v1/sandboxes", false, "", nil); code != http.StatusUnauthorized {
		t.Fatalf("unsigned, no key: %d %s", code, out)
	}
	now := time.Now().UTC()
	obj := &sandbox.Sandbox{ID: sandbox.NewID(), Owner: "carol", Template: "tiny", State: sandbox.Creating,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), Attrs: sandbox.Attrs{Cluster: sandbox.ClusterState{Node: "bin1", BoundAt: now}}}
	if err := ks.CreateSandbox(ctx, obj); err != nil {
		t.Fatal(err)
	}
	if code, out := do("POST", "/v1/sandboxes", true, obj.ID, map[string]any{"template": "tiny"}); code != http.StatusCreated {
		t.Fatalf("signed create: %d %s", code, out)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		o, err := ks.GetSandbox(ctx, obj.ID)
		if err != nil {
			return err
		}
		if o.State != sandbox.Running {
			return fmt.Errorf("object %s", o.State)
		}
		return nil
	})
	if code, out := do("DELETE", "/v1/sandboxes/"+obj.ID, true, "", nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("signed delete: %d %s", code, out)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		// The node marks the object deleted; a replica removes it.
		if o, err := ks.GetSandbox(ctx, obj.ID); !errs.Is(err, errs.NotFound) && (err != nil || o.State != sandbox.Deleted) {
			return fmt.Errorf("object not marked deleted: %v", err)
		}
		return nil
	})

	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("berth node exited: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("berth node did not stop on SIGTERM")
	}
}

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/testutil"
)

// clusterProc is one `berth node` or `berth serve --cluster` process.
type clusterProc struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	lw   *lockedWriter
	url  string // its plain REST listener
	key  string // its admin key
	name string
}

func (p *clusterProc) logs() string {
	p.lw.mu.Lock()
	defer p.lw.mu.Unlock()
	return p.log.String()
}

// startClusterProc runs berth with args plus --data-dir and --listen and
// waits for its health and admin key.
func startClusterProc(t *testing.T, bin, name string, args ...string) *clusterProc {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "bc") // short: agent socket paths live below it
	if err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	p := &clusterProc{log: &bytes.Buffer{}, url: "http://" + addr, name: name}
	p.lw = &lockedWriter{w: p.log}
	p.cmd = exec.Command(filepath.Join(bin, "berth"), append(args, "--data-dir", dataDir, "--listen", addr)...)
	p.cmd.Stdout, p.cmd.Stderr = p.lw, p.lw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.logs())
		}
		_ = os.RemoveAll(dataDir)
	})
	err = testutil.Within(90 * time.Second).Every(50 * time.Millisecond).Until(func() error {
		select {
		case <-exited:
			t.Fatalf("%s exited:\n%s", name, p.logs())
		default:
		}
		resp, err := http.Get(p.url + "/v1/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		b, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
		if err != nil {
			return err
		}
		p.key = strings.TrimSpace(string(b))
		return nil
	})
	if err != nil {
		t.Fatalf("%s did not come up: %v\n%s", name, err, p.logs())
	}
	return p
}

// TestClusterSecrets: credential injection in cluster mode, end to end. A
// real kube-apiserver, one real `berth node` with networking (its egress
// proxy in front of the test internet's secret.test, whose HTTPS server says
// whether it saw the real token) and one `berth serve --cluster` replica.
// Through the replica only: alice sets TOKEN, creates a sandbox granted it
// (placed on the node), and the node's proxy injects it; the Record in etcd
// holds no plaintext; the node's own store has it (mirrored), and not bob's,
// who has no sandbox there; bob cannot read or delete alice's; a changed value is injected within seconds, and after a
// delete the placeholder goes through unreplaced and the node's copy is gone.
func TestClusterSecrets(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	inet := newInternet(t)
	bin := testutil.BuildBinaries(t)
	ks, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		testutil.Missing(t, "kube-apiserver and etcd (scripts/kube-assets.sh): %v", err)
	}
	t.Cleanup(ks.Stop)
	ctx := t.Context()
	ns := ks.Namespace(t)
	kc := ks.Kubeconfig(t, "", ns)
	// Right after start the API server answers 429 for a while.
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		var l berthv1.RecordList
		return ks.Client.List(ctx, berthv1.Records, ns, kube.ListOptions{Limit: 1}, &l)
	})

	peerAddr := freePort(t)
	nodeArgs := append([]string{"node", "--kubeconfig", kc, "--namespace", ns, "--name", "sn1", "--peer-listen", peerAddr,
		"--advertise", peerAddr, "--lease-duration", "10s", "--no-default-template"}, testNetwork(t)...)
	node := startClusterProc(t, bin, "berth node", append(nodeArgs, inet.serveArgs()...)...)
	nodeCLI := &server{t: t, bin: bin, url: node.url, key: node.key}
	t.Cleanup(func() { // before the node stops (cleanups run last first): its sandboxes outlive it
		out, _ := nodeCLI.run("ls", "--json")
		var list []struct{ ID string }
		_ = json.Unmarshal([]byte(out), &list)
		for _, sb := range list {
			nodeCLI.run("rm", "-f", sb.ID)
		}
	})
	if out, code := nodeCLI.run("template", "import", "tiny", tinyTar(t)); code != 0 {
		t.Fatalf("template import on the node: %s", out)
	}
	rep := startClusterProc(t, bin, "berth serve --cluster", "serve", "--cluster", "--kubeconfig", kc, "--namespace", ns)
	admin := &server{t: t, bin: bin, url: rep.url, key: rep.key}
	alice := &server{t: t, bin: bin, url: rep.url, key: strings.TrimSpace(admin.must("key", "create", "--owner", "alice"))}
	bob := strings.TrimSpace(admin.must("key", "create", "--owner", "bob"))
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		if out := admin.must("template", "ls", "--json"); !strings.Contains(out, `"tiny"`) {
			return fmt.Errorf("the replica lists no tiny yet: %s", out)
		}
		return nil
	})

	if out, code := alice.runAs(alice.key, strings.NewReader(testToken+"\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set through the replica: %s", out)
	}
	// etcd holds the sealed value only.
	var rl berthv1.RecordList
	if err := ks.Client.List(ctx, berthv1.Records, ns, kube.ListOptions{LabelSelector: berthv1.LabelTable + "=" + kubestore.SecretsTable}, &rl); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(rl)
	if len(rl.Items) != 1 || bytes.Contains(raw, []byte(testToken)) {
		t.Fatalf("secret records (%d) hold the plaintext or are not one: %s", len(rl.Items), raw)
	}

	// A secret alice does not have (bob's names are his): refused by the
	// node, naming it, and no object is left.
	if out, code := alice.run("create", "--template", "tiny", "--secret", "NOPE"); code == 0 || !strings.Contains(out, "NOPE") {
		t.Fatalf("create granting an unknown secret: exit %d %s", code, out)
	}
	id := alice.create("--secret", "TOKEN")
	if st, sb := alice.api(alice.key, "GET", "/v1/sandboxes/"+id, nil); st != 200 || fmt.Sprint(sb["extra"]) != "map[node:sn1]" {
		t.Fatalf("sandbox %s through the replica: %d %v (want it on sn1)", id, st, sb)
	}
	// The node's own store has alice's TOKEN (its proxy's source).
	nodeHas := func() bool {
		out := nodeCLI.must("secret", "ls", "--owner", "alice", "--json")
		return strings.Contains(out, `"TOKEN"`)
	}
	if !nodeHas() {
		t.Fatalf("the node's store lacks alice's TOKEN after the create")
	}
	ph := alice.must("exec", id, "--", "sh", "-c", `printf %s "$TOKEN"`)
	if !strings.HasPrefix(ph, "berth-secret-token-") {
		t.Fatalf("TOKEN in the sandbox = %q, want a placeholder", ph)
	}
	alice.installFetch(id, inet)
	with := func() string {
		out, _ := alice.fetchTLS(id, "https://secret.test/", "Authorization: Bearer "+ph)
		return out
	}
	if got := with(); !strings.Contains(got, "auth=real") {
		t.Fatalf("secret.test saw %q, want the real token injected by the node", got)
	}

	// bob: none listed, alice's not deletable.
	if out, code := alice.runAs(bob, nil, "secret", "ls", "--json"); code != 0 || strings.Contains(out, "TOKEN") {
		t.Errorf("bob's secrets: exit %d %s", code, out)
	}
	if st, _ := alice.api(bob, "DELETE", "/v1/secrets/TOKEN", nil); st != 404 {
		t.Errorf("bob deleting alice's TOKEN: %d, want 404", st)
	}
	if got := with(); !strings.Contains(got, "auth=real") {
		t.Fatalf("after bob's delete, secret.test saw %q", got)
	}

	// bob's own secret, while bob has nothing on the node: not mirrored
	// there (checked after the rotation below, whose pass lists it).
	if out, code := alice.runAs(bob, strings.NewReader("bobs-value\n"), "secret", "set", "BOBTOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("bob's secret set: %s", out)
	}

	// A changed value is what the node injects next, within seconds.
	if out, code := alice.runAs(alice.key, strings.NewReader("rotated-value-42\n"), "secret", "set", "TOKEN", "--host", "secret.test"); code != 0 {
		t.Fatalf("secret set (rotate): %s", out)
	}
	start := time.Now()
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		if got := with(); !strings.Contains(got, "auth=other") {
			return fmt.Errorf("secret.test saw %q, want the rotated value (auth=other)", got)
		}
		return nil
	})
	t.Logf("rotated value injected %s after the put", time.Since(start).Round(time.Millisecond))
	if out := nodeCLI.must("secret", "ls", "--owner", "bob", "--json"); strings.Contains(out, "BOBTOKEN") {
		t.Errorf("the node holds bob's secret, and bob has no sandbox there: %s", out)
	}

	// A delete stops injection within seconds, and the node's copy goes.
	if st, _ := alice.api(alice.key, "DELETE", "/v1/secrets/TOKEN", nil); st != 204 {
		t.Fatalf("delete TOKEN through the replica: %d", st)
	}
	start = time.Now()
	testutil.Eventually(t, testutil.Within(10*time.Second), func() error {
		if got := with(); !strings.Contains(got, "auth=placeholder") {
			return fmt.Errorf("secret.test saw %q, want the placeholder unreplaced", got)
		}
		return nil
	})
	t.Logf("injection stopped %s after the delete", time.Since(start).Round(time.Millisecond))
	if nodeHas() {
		t.Errorf("the node still holds alice's TOKEN after its delete")
	}
	alice.must("rm", "-f", id)
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		var l berthv1.SandboxList
		if err := ks.Client.List(ctx, berthv1.Sandboxes, ns, kube.ListOptions{}, &l); err != nil || len(l.Items) != 0 {
			return fmt.Errorf("%d Sandbox objects left (%v), want none", len(l.Items), err)
		}
		return nil
	})
}

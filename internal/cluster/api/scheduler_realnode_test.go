package api

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/testutil"
)

// Against a real `berth node` (runc): a Sandbox applied with kubectl,
// spec only, is bound by the replica's scheduler, made by the node from
// the object and answers exec through the replica; `kubectl get sbx` shows
// it running on the node. Then, with --queue-wait, a create the node has
// no memory for waits, and runs once the sandbox holding the memory is
// deleted.
func TestSchedulerRealNode(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	c := newCluster(t)
	ctx := t.Context()
	rep, url := c.replica(func(cfg *Config) { cfg.QueueWait = 90 * time.Second })
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { rep.Run(rctx); close(ran) }()
	defer func() { stop(); <-ran }()

	dataDir, err := os.MkdirTemp("", "bn")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	listen, peerAddr := freeAddr(t), freeAddr(t)
	var logs lockedBuf
	cmd := exec.Command(filepath.Join(bin, "berth"), "node", "--kubeconfig", srv.Kubeconfig(t, "", c.ns), "--namespace", c.ns,
		"--name", "real1", "--data-dir", dataDir, "--listen", listen, "--peer-listen", peerAddr, "--advertise", peerAddr,
		"--lease-duration", "10s", "--no-default-template", "--no-network")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("berth node:\n%s", logs.String())
		}
	}()
	testutil.Eventually(t, testutil.Within(90*time.Second), func() error {
		_, err := rep.builderNode(ctx, "real1")
		return err
	})
	tar, err := os.ReadFile(tinyTar(t))
	if err != nil {
		t.Fatal(err)
	}
	if st, _, body := c.do("PUT", url+"/v1/templates/tiny/tar", c.admin, string(tar)); st != 201 {
		t.Fatalf("import tiny: %d %s", st, body)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		tpl, err := c.st.GetTemplate(ctx, "tiny")
		if err != nil || tpl.Fingerprint == "" {
			return fmt.Errorf("tiny not published yet: %v", err)
		}
		return nil
	})

	// kubectl apply: spec only, no node, no status.
	start := time.Now()
	c.kubectlApply(sandboxYAML("kube1", "tiny", 256))
	testutil.Eventually(t, testutil.Within(60*time.Second), func() error {
		o := c.object("kube1")
		if o.Status.State != "running" || o.Spec.NodeName != "real1" {
			return fmt.Errorf("kube1: state %q node %q reason %q", o.Status.State, o.Spec.NodeName, o.Status.Reason)
		}
		return nil
	})
	t.Logf("kubectl apply → running on real1 in %s", time.Since(start).Round(10*time.Millisecond))
	out, err := exec.CommandContext(ctx, srv.Kubectl(), "--kubeconfig", srv.Kubeconfig(t, "", c.ns), "-n", c.ns, "get", "sbx", "kube1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "running") || !strings.Contains(string(out), "real1") {
		t.Fatalf("kubectl get sbx: %v\n%s", err, out)
	}
	t.Logf("kubectl get sbx:\n%s", out)
	if st, body := c.execOut(url, "kube1", `{"cmd":["echo","hello-from-kubectl"]}`); st != 200 || body != "hello-from-kubectl\n" {
		t.Fatalf("exec in kube1 through the replica: %d %q", st, body)
	}
	if st, _, body := c.do("POST", url+"/v1/sandboxes/kube1/exec", c.bob, `{"cmd":["true"]}`); st != 404 {
		t.Fatalf("bob execs in alice's kubectl sandbox: %d %s", st, body)
	}

	// Fill the node's memory but 256 MiB, then queue a 512 MiB create.
	var n berthv1.Node
	if err := srv.Client.Get(ctx, berthv1.Nodes, c.ns, "real1", &n); err != nil {
		t.Fatal(err)
	}
	fill := n.Status.Capacity.MemoryMiB - 256 - 256
	st, _, body := c.do("POST", url+"/v1/sandboxes", c.key, fmt.Sprintf(`{"template":"tiny","memory_mib":%d}`, fill))
	var big wire.Sandbox
	if err := json.Unmarshal([]byte(body), &big); st != 201 || err != nil {
		t.Fatalf("create the filler (%d MiB): %d %s", fill, st, body)
	}
	type answer struct {
		st   int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		st, _, body := c.do("POST", url+"/v1/sandboxes", c.key, `{"template":"tiny","memory_mib":512,"env":{"QUEUED":"yes"}}`)
		got <- answer{st, body}
	}()
	testutil.Eventually(t, testutil.Within(20*time.Second), func() error {
		all, _, err := c.st.ListSandboxes(ctx, storeFilterPending())
		if err != nil || len(all) != 1 || all[0].Reason != ReasonQueued || !strings.Contains(all[0].Message, "memory") {
			return fmt.Errorf("queued objects: %v %+v", err, all)
		}
		return nil
	})
	select {
	case a := <-got:
		t.Fatalf("the queued create answered while the node was full: %d %s", a.st, a.body)
	case <-time.After(2 * time.Second):
	}
	if st, _, body := c.do("DELETE", url+"/v1/sandboxes/"+big.ID, c.key, ""); st/100 != 2 {
		t.Fatalf("delete the filler: %d %s", st, body)
	}
	freed := time.Now()
	var a answer
	select {
	case a = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("the queued create did not run after the delete")
	}
	var q wire.Sandbox
	if err := json.Unmarshal([]byte(a.body), &q); a.st != 201 || err != nil || q.State != "running" {
		t.Fatalf("queued create: %d %s", a.st, a.body)
	}
	t.Logf("queued create answered %s after the delete freed room", time.Since(freed).Round(10*time.Millisecond))
	st, body = c.execOut(url, q.ID, `{"cmd":["sh","-c","echo queued=$QUEUED"]}`)
	if st != 200 || body != "queued=yes\n" {
		t.Fatalf("exec in the queued sandbox (its env came with the forwarded request): %d %s", st, body)
	}
	for _, id := range []string{"kube1", q.ID} {
		if st, _, body := c.do("DELETE", url+"/v1/sandboxes/"+id, c.key, ""); st/100 != 2 {
			t.Errorf("delete %s: %d %s", id, st, body)
		}
	}
}

// execOut runs an exec through the replica at url as alice and returns
// its stdout, from the stream's events.
func (c *cluster) execOut(url, id, req string) (int, string) {
	c.t.Helper()
	st, _, body := c.do("POST", url+"/v1/sandboxes/"+id+"/exec", c.key, req)
	var out strings.Builder
	dec := json.NewDecoder(strings.NewReader(body))
	for {
		var ev wire.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			break
		}
		if ev.Type == "stdout" {
			out.Write(ev.Data)
		}
	}
	return st, out.String()
}

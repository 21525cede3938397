package api

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/rootfs"
	"github.com/berth-dev/berth/internal/testutil"
)

// Against a real `berth node`: a template imported through the replica
// is made on the node, published by it (listed by the replica), in its
// build history; usage, quotas, snapshots and the audit come back whole
// (no node unanswered); a warm pool set through the replica (the CLI) is
// filled by the node; leases are asked of it; the template's delete
// removes it and its object; /metrics counts the replica's work.
func TestRealNodeSurface(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc")
	bin := testutil.BuildBinaries(t)
	c := newCluster(t)
	ctx := t.Context()
	dataDir, err := os.MkdirTemp("", "bn")
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.RemoveAllChecked(t, dataDir) // last: after the node stopped
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
	// Ready once registered with a fresh Lease, and asked.
	testutil.Eventually(t, testutil.Within(90*time.Second), func() error {
		if _, err := c.rep.builderNode(ctx, "real1"); err != nil {
			return err
		}
		st, hdr, body := c.do("GET", c.url+"/v1/usage", c.admin, "")
		if st != 200 || hdr.Get(HeaderUnanswered) != "" {
			return fmt.Errorf("usage: %d unanswered %q %s", st, hdr.Get(HeaderUnanswered), body)
		}
		return nil
	})

	tar, err := os.ReadFile(tinyTar(t))
	if err != nil {
		t.Fatal(err)
	}
	st, hdr, body := c.do("PUT", c.url+"/v1/templates/tiny/tar", c.admin, string(tar))
	if st != 201 || hdr.Get(HeaderNode) != "real1" || !strings.Contains(body, `"name": "tiny"`) {
		t.Fatalf("import through the replica: %d node %q %s", st, hdr.Get(HeaderNode), body)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		_, _, body := c.do("GET", c.url+"/v1/templates", c.admin, "")
		if !strings.Contains(body, `"name": "tiny"`) {
			return fmt.Errorf("templates: %s", body)
		}
		return nil
	})
	st, hdr, body = c.do("GET", c.url+"/v1/builds", c.admin, "")
	var bl wire.TemplateBuildList
	if err := json.Unmarshal([]byte(body), &bl); st != 200 || err != nil || len(bl.Builds) != 1 || bl.Builds[0].Template != "tiny" ||
		bl.Builds[0].Kind != "import" || hdr.Get(HeaderUnanswered) != "" {
		t.Fatalf("builds: %d %s", st, body)
	}
	for _, path := range []string{"/v1/usage", "/v1/reports/orphans", "/v1/quotas/alice", "/v1/snapshots", "/v1/audit", "/v1/usage/series?by=owner"} {
		st, hdr, body := c.do("GET", c.url+path, c.admin, "")
		if st != 200 || hdr.Get(HeaderUnanswered) != "" {
			t.Errorf("GET %s: %d unanswered %q %s", path, st, hdr.Get(HeaderUnanswered), body)
		}
	}
	// The CLI, pointed at the replica, reads the same surface.
	for _, args := range [][]string{{"usage", "--json"}, {"cost", "--json"}, {"report", "orphans", "--json"}, {"builds", "--json"},
		{"quota", "ls"}, {"snapshot", "ls", "--json"}, {"audit", "ls", "--json"}, {"events", "--json"}, {"template", "ls", "--json"}} {
		cli := exec.CommandContext(ctx, filepath.Join(bin, "berth"), args...)
		cli.Env = append(os.Environ(), "BERTH_URL="+c.url, "BERTH_API_KEY="+c.admin)
		if out, err := cli.CombinedOutput(); err != nil {
			t.Errorf("berth %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	berth := func(key string, args ...string) (string, error) {
		cli := exec.CommandContext(ctx, filepath.Join(bin, "berth"), args...)
		cli.Env = append(os.Environ(), "BERTH_URL="+c.url, "BERTH_API_KEY="+key)
		out, err := cli.CombinedOutput()
		return string(out), err
	}
	// A warm pool set through the replica is kept by the node: its ready
	// member shows in `berth pool ls` through the replica; while it is
	// there the template is not removed; `berth pool rm` drains it.
	if out, err := berth(c.key, "pool", "set", "tiny", "--size", "1"); err == nil || !strings.Contains(out, "admin") {
		t.Errorf("a tenant's berth pool set: %v: %s", err, out)
	}
	if out, err := berth(c.admin, "pool", "set", "tiny", "--size", "1", "--memory", "64"); err != nil || !strings.Contains(out, "pool tiny: size 1") {
		t.Fatalf("berth pool set: %v: %s", err, out)
	}
	testutil.Eventually(t, testutil.Within(90*time.Second), func() error {
		out, err := berth(c.admin, "pool", "ls", "--json")
		var ps []wire.PoolStatus
		if err != nil || json.Unmarshal([]byte(out), &ps) != nil || len(ps) != 1 || ps[0].Ready != 1 || ps[0].Target != 1 || ps[0].State != "ready" {
			return fmt.Errorf("berth pool ls: %v: %s", err, out)
		}
		return nil
	})
	// A new shape at the same size reaches the node's own pool.
	if out, err := berth(c.admin, "pool", "set", "tiny", "--size", "1", "--memory", "96"); err != nil {
		t.Fatalf("berth pool set, a new shape: %v: %s", err, out)
	}
	nodeKey, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		st, _, body := c.do("GET", "http://"+listen+"/v1/pools", strings.TrimSpace(string(nodeKey)), "")
		var ps []wire.PoolStatus
		if st != 200 || json.Unmarshal([]byte(body), &ps) != nil || len(ps) != 1 || ps[0].Resources.MemoryMiB != 96 {
			return fmt.Errorf("real1's own pools: %d %s", st, body)
		}
		return nil
	})
	if out, err := berth(c.admin, "template", "rm", "tiny"); err == nil || !strings.Contains(out, "pool") {
		t.Errorf("berth template rm of a pooled template: %v: %s", err, out)
	}
	if out, err := berth(c.admin, "pool", "rm", "tiny"); err != nil {
		t.Fatalf("berth pool rm: %v: %s", err, out)
	}
	if out, err := berth(c.admin, "pool", "ls", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("berth pool ls after rm: %v: %s", err, out)
	}
	// Leases are asked of the node (none yet); a revoke of a lease it
	// does not hold is its 404.
	if out, err := berth(c.key, "secret", "leases", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("berth secret leases: %v: %s", err, out)
	}
	if st, hdr, body := c.do("GET", c.url+"/v1/leases", c.admin, ""); st != 200 || hdr.Get(HeaderUnanswered) != "" || !strings.Contains(body, `"leases": []`) {
		t.Errorf("GET /v1/leases: %d %q %s", st, hdr.Get(HeaderUnanswered), body)
	}
	if out, err := berth(c.key, "secret", "revoke", "lnosuch"); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("berth secret revoke of no lease: %v: %s", err, out)
	}
	st, hdr, body = c.do("GET", c.url+"/v1/audit?node=real1", c.admin, "")
	if st != 200 || hdr.Get(HeaderNode) != "real1" || !strings.Contains(body, "entries") {
		t.Errorf("real1's audit: %d %s", st, body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/snapshots/nosuch", c.key, ""); st != 404 {
		t.Errorf("unknown snapshot: %d %s", st, body)
	}

	// A sandbox made through the replica counts in alice's quota use; its
	// snapshot is found on the node by id, and deleted there.
	sb := c.create(`{"template":"tiny"}`)
	var qi wire.QuotaInfo
	_, _, body = c.do("GET", c.url+"/v1/quotas/alice", c.key, "")
	if err := json.Unmarshal([]byte(body), &qi); err != nil || qi.Use.Sandboxes != 1 {
		t.Fatalf("alice's quota with one sandbox: %s", body)
	}
	st, _, body = c.do("POST", c.url+"/v1/sandboxes/"+sb.ID+"/snapshot", c.key, `{"name":"s1"}`)
	var sn wire.Snapshot
	if err := json.Unmarshal([]byte(body), &sn); st/100 != 2 || err != nil || sn.ID == "" {
		t.Fatalf("snapshot: %d %s", st, body)
	}
	_, _, body = c.do("GET", c.url+"/v1/snapshots", c.key, "")
	if !strings.Contains(body, sn.ID) {
		t.Fatalf("alice's snapshots: %s", body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/snapshots/"+sn.ID, c.bob, ""); st != 404 {
		t.Fatalf("bob reads alice's snapshot: %d %s", st, body)
	}
	_, _, body = c.do("GET", c.url+"/v1/quotas/alice", c.key, "")
	if err := json.Unmarshal([]byte(body), &qi); err != nil || qi.Use.Snapshots != 1 {
		t.Fatalf("alice's quota with one snapshot: %s", body)
	}
	if st, hdr, body := c.do("DELETE", c.url+"/v1/snapshots/"+sn.ID, c.key, ""); st/100 != 2 || hdr.Get(HeaderNode) != "real1" {
		t.Fatalf("delete the snapshot: %d %s", st, body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/snapshots/"+sn.ID, c.key, ""); st != 404 {
		t.Fatalf("the deleted snapshot: %d %s", st, body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/sandboxes/"+sb.ID, c.key, ""); st/100 != 2 {
		t.Fatalf("delete the sandbox: %d %s", st, body)
	}
	testutil.Eventually(t, testutil.Within(30*time.Second), func() error {
		st, _, body := c.do("DELETE", c.url+"/v1/templates/tiny", c.admin, "")
		if st != 200 {
			return fmt.Errorf("delete tiny: %d %s", st, body)
		}
		return nil
	})
	if st, _, body := c.do("DELETE", c.url+"/v1/templates/tiny", c.admin, ""); st != 404 {
		t.Fatalf("delete tiny again: %d %s", st, body)
	}
	if _, err := c.st.GetTemplate(ctx, "tiny"); !errs.Is(err, errs.NotFound) {
		t.Fatalf("tiny's object after the delete: %v", err)
	}
	// The replica's own /metrics counted what it sent real1.
	st, _, body = c.do("GET", c.url+"/metrics", c.admin, "")
	if st != 200 || !strings.Contains(body, `berth_replica_forward_seconds_count{node="real1"}`) ||
		!strings.Contains(body, `berth_replica_requests_total{route="PUT /v1/pools/{template}",code="200"} 2`) {
		t.Errorf("/metrics: %d %s", st, body)
	}
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

func tinyTar(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := rootfs.BusyboxRootFS(root); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tiny.tar")
	if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", p, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	return p
}

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusternode "github.com/berth-dev/berth/internal/cluster/node"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/template"
	"github.com/berth-dev/berth/internal/testutil"
)

// sdkScript uses the unmodified npm e2b SDK (test/e2b's pinned 2.51.0)
// against the replicas, as a user's program would: E2B_API_URL and
// E2B_SANDBOX_URL are a replica. It creates through replica A, writes a
// file through A, connects and reads it back through replica B, lists and
// gets the sandbox, and kills it. Files only here: commands.run needs bash
// (sdkCommandsScript).
const sdkScript = `
import { Sandbox } from 'e2b'
const base = { apiKey: process.env.SDK_KEY, requestTimeoutMs: 120000 }
const a = { ...base, apiUrl: process.env.SDK_A, sandboxUrl: process.env.SDK_A }
const b = { ...base, apiUrl: process.env.SDK_B, sandboxUrl: process.env.SDK_B }
const sbx = await Sandbox.create('tiny', { ...a, metadata: { via: 'sdk' }, timeoutMs: 300000 })
await sbx.files.write('/tmp/sdk.txt', 'hello from the sdk')
const other = await Sandbox.connect(sbx.sandboxId, b)
const text = await other.files.read('/tmp/sdk.txt')
const entries = (await other.files.list('/tmp')).map(e => e.name)
const info = await Sandbox.getInfo(sbx.sandboxId, b)
const page = await Sandbox.list({ ...a, query: { metadata: { via: 'sdk' } } }).nextItems()
const running = await sbx.isRunning()
console.log(JSON.stringify({ id: sbx.sandboxId, text, entries, infoId: info.sandboxId, listed: page.map(s => s.sandboxId), running }))
await Sandbox.kill(sbx.sandboxId, b)
`

// e2bDir is test/e2b with its node_modules, installed as the lockfile says
// when missing (scripts/test.sh installs them only after the Go tests).
func e2bDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(kubetest.RepoRoot(), "test", "e2b")
	if d := os.Getenv("BERTH_E2B_DIR"); d != "" {
		dir = d
	}
	testutil.RequireTool(t, "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		npm := testutil.RequireTool(t, "npm")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			testutil.Missing(t, "npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

func sdkThroughReplicas(t *testing.T, c *cluster, key string) {
	dir := e2bDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--input-type=module", "-e", sdkScript)
	cmd.Dir = dir // ESM resolves 'e2b' from the working directory's node_modules for -e
	cmd.Env = append(os.Environ(), "SDK_KEY="+key, "SDK_A="+c.replicas[0].url, "SDK_B="+c.replicas[1].url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the e2b SDK through the replicas: %v\n%s\n%s", err, out, stderr.String())
	}
	var got struct {
		ID      string   `json:"id"`
		Text    string   `json:"text"`
		Entries []string `json:"entries"`
		InfoID  string   `json:"infoId"`
		Listed  []string `json:"listed"`
		Running bool     `json:"running"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("SDK script output %q: %v", out, err)
	}
	if got.Text != "hello from the sdk" || got.InfoID != got.ID || !got.Running ||
		len(got.Listed) != 1 || got.Listed[0] != got.ID || !strings.Contains(strings.Join(got.Entries, " "), "sdk.txt") {
		t.Errorf("SDK saw %+v", got)
	}
	// It ran on the node it was bound to, and after kill it runs nowhere.
	obj, err := c.sandboxObj(got.ID)
	if err == nil && obj.Status.State != "deleted" {
		t.Errorf("SDK sandbox %s after kill: object state %q", got.ID, obj.Status.State)
	}
	for _, n := range c.nodes {
		if n.running() && localIDs(t, n)[got.ID] {
			t.Errorf("SDK sandbox %s still runs on %s after kill", got.ID, n.name)
		}
	}
	t.Logf("e2b SDK 2.51.0 through both replicas: created %s, file written via replica1 read via replica2, listed, killed", got.ID)
}

// sdkCommandsScript runs commands.run through the replicas. The SDK sends
// every command as /bin/bash -l -c CMD (envd's process.Start; 2.51's
// dist/index.mjs) and berth passes argv as given, on one host as here: a
// template without bash (busybox tiny) fails it with "no such file". So
// this uses the template one host's E2B suite uses, default (Debian
// bookworm). Created through replica A; the commands go through replica B:
// output, exit status, the create's envs, a failing command's
// CommandExitError.
const sdkCommandsScript = `
import { Sandbox } from 'e2b'
const base = { apiKey: process.env.SDK_KEY, requestTimeoutMs: 120000 }
const a = { ...base, apiUrl: process.env.SDK_A, sandboxUrl: process.env.SDK_A }
const b = { ...base, apiUrl: process.env.SDK_B, sandboxUrl: process.env.SDK_B }
const sbx = await Sandbox.create('default', { ...a, envs: { A: 'from-create' }, metadata: { via: 'sdk-commands' }, timeoutMs: 300000 })
try {
  const other = await Sandbox.connect(sbx.sandboxId, b)
  const hi = await other.commands.run('echo hi')
  const env = await other.commands.run('echo "$A:$0"')
  let failed = null
  try {
    await other.commands.run('echo partial; echo why >&2; exit 3')
  } catch (err) {
    failed = { name: err.constructor.name, exitCode: err.exitCode, stdout: err.stdout, stderr: err.stderr }
  }
  console.log(JSON.stringify({ id: sbx.sandboxId, stdout: hi.stdout, exitCode: hi.exitCode, env: env.stdout, failed }))
} finally {
  await Sandbox.kill(sbx.sandboxId, b)
}
`

// defaultTar is the default template's tarball from the host's template
// cache (built there once by debootstrap, ~80 s, when missing).
func defaultTar(t *testing.T) string {
	t.Helper()
	testutil.RequireTool(t, "debootstrap")
	dir := template.DefaultCacheDir
	if d := os.Getenv("BERTH_CACHE_DIR"); d != "" {
		dir = filepath.Join(d, "rootfs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p, err := template.BuildDefault(ctx, dir, nil)
	if err != nil {
		t.Fatalf("default template: %v", err)
	}
	return p
}

// sdkCommandsThroughReplicas imports default into one node only (200 MB:
// not three copies for one sandbox; placed elsewhere, that node fetches
// the layers from it) and runs sdkCommandsScript.
func sdkCommandsThroughReplicas(t *testing.T, c *cluster, key string) {
	dir := e2bDir(t)
	tar := defaultTar(t)
	start := time.Now()
	if out, err := c.nodes[0].cli("template", "import", "default", tar); err != nil {
		t.Fatalf("%s: template import default: %v: %s", c.nodes[0].name, err, out)
	}
	testutil.Eventually(t, testutil.Within(60*time.Second).Every(250*time.Millisecond), func() error {
		var tl berthv1.TemplateList
		if err := c.kc.List(context.Background(), berthv1.Templates, ns, kube.ListOptions{}, &tl); err != nil {
			return err
		}
		for _, tp := range tl.Items {
			if tp.Spec.Name != "default" {
				continue
			}
			// Fetchable by the other nodes once each layer's blob digest is
			// recorded too: the object is written first, the digests after
			// the layers were packed (seconds for 200 MB). A create placed
			// elsewhere in between fails (cluster/node's publish).
			blobs := map[string]string{}
			_ = json.Unmarshal([]byte(tp.Annotations[clusternode.AnnLayerBlobs]), &blobs)
			for _, l := range tp.Status.Layers {
				if blobs[l] == "" {
					return fmt.Errorf("template default: layer %s has no blob digest yet", l)
				}
			}
			if len(tp.Status.Layers) == 0 {
				return fmt.Errorf("template default lists no layers")
			}
			return nil
		}
		return fmt.Errorf("template default not published")
	})
	t.Logf("default template imported on %s and published in %s", c.nodes[0].name, time.Since(start).Round(100*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--input-type=module", "-e", sdkCommandsScript)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SDK_KEY="+key, "SDK_A="+c.replicas[0].url, "SDK_B="+c.replicas[1].url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("commands.run through the replicas: %v\n%s\n%s", err, out, stderr.String())
	}
	var got struct {
		ID       string `json:"id"`
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitCode"`
		Env      string `json:"env"`
		Failed   *struct {
			Name     string `json:"name"`
			ExitCode int    `json:"exitCode"`
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
		} `json:"failed"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("SDK commands script output %q: %v", out, err)
	}
	if got.Stdout != "hi\n" || got.ExitCode != 0 {
		t.Errorf("commands.run('echo hi') = %q exit %d, want \"hi\\n\" exit 0", got.Stdout, got.ExitCode)
	}
	if got.Env != "from-create:/bin/bash\n" {
		t.Errorf("commands.run('echo \"$A:$0\"') = %q, want the create's A and bash", got.Env)
	}
	if f := got.Failed; f == nil || f.Name != "CommandExitError" || f.ExitCode != 3 || f.Stdout != "partial\n" || f.Stderr != "why\n" {
		t.Errorf("a failing command: %+v, want CommandExitError exit 3 with its output", got.Failed)
	}
	where := "its object is gone"
	if obj, err := c.sandboxObj(got.ID); err == nil {
		where = "bound to " + obj.Spec.NodeName
		if obj.Status.State != "deleted" {
			t.Errorf("SDK commands sandbox %s after kill: object state %q", got.ID, obj.Status.State)
		}
	}
	// Which nodes hold default now: node1, and the node the sandbox ran on
	// when placement put it elsewhere (its layers fetched from node1).
	var holders []string
	for _, n := range c.nodes {
		if out, err := n.cli("template", "ls"); err == nil && strings.Contains(out, "default") {
			holders = append(holders, n.name)
		}
	}
	t.Logf("e2b SDK 2.51.0 commands.run through replica2 in %s (created via replica1; after kill %s; default now on %v): %q",
		got.ID, where, holders, got.Stdout)
}

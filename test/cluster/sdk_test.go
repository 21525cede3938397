package cluster

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/testutil"
)

// sdkScript uses the unmodified npm e2b SDK (test/e2b's pinned 2.51.0)
// against the replicas, as a user's program would: E2B_API_URL and
// E2B_SANDBOX_URL are a replica. It creates through replica A, writes a
// file through A, connects and reads it back through replica B, lists and
// gets the sandbox, and kills it. Files only: commands.run needs bash, and
// the test's template is busybox.
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

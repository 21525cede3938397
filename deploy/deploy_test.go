// Package deploy_test checks berth's Kubernetes manifests against a real
// kube-apiserver (internal/kube/kubetest): the CRDs install, everything
// else passes a server-side dry run, the RBAC grants each service account
// what it needs and refuses what it must not do, and the CRDs' schemas keep
// every field of the Go types (a structural schema prunes what it does not
// name).
package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/cluster/peer"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/kubestore"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/testutil"
)

var srv *kubetest.Server

// The manifests' namespace and the service accounts' users, as the API
// server names a service account's token.
const (
	ns        = "berth"
	nodeToken = "berth-test-node-token"
	apiToken  = "berth-test-api-token"
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
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "deploy:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "deploy: skipping, no API server:", err)
		os.Exit(0)
	}
	srv = s
	code := m.Run()
	s.Stop()
	os.Exit(code)
}

func deployDir(t *testing.T) string { return filepath.Join(kubetest.RepoRoot(), "deploy") }

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	bin := srv.Kubectl()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kubectl not in %s", srv.Assets)
		}
		t.Skipf("kubectl not in %s", srv.Assets)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", srv.Kubeconfig(t, "", "default")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// applyReal applies the namespace and the RBAC for real (idempotent: every
// test may call it).
func applyReal(t *testing.T) {
	t.Helper()
	kubectl(t, "apply", "--server-side", "--field-manager=berth-test", "-f", filepath.Join(deployDir(t), "00-namespace.yaml"))
	kubectl(t, "apply", "--server-side", "--field-manager=berth-test", "-f", filepath.Join(deployDir(t), "10-rbac.yaml"))
}

// TestManifestsApply: the CRDs installed for real (kubetest did, from
// deploy/crds, and kubectl agrees), then every manifest of deploy/ through
// a server-side dry run: admission, defaulting and validation of the
// Deployment, the DaemonSet, the Service and the RBAC, without a
// controller to run them.
func TestManifestsApply(t *testing.T) {
	out := kubectl(t, "apply", "--server-side", "--field-manager=berth-test", "-f", filepath.Join(deployDir(t), "crds"))
	for _, crd := range []string{"sandboxes", "templates", "warmpools", "nodes", "records"} {
		if !strings.Contains(out, crd+".berth.dev") {
			t.Errorf("CRD %s not applied:\n%s", crd, out)
		}
	}
	// The namespace must exist for a dry run of what goes in it.
	kubectl(t, "apply", "--server-side", "--field-manager=berth-test", "-f", filepath.Join(deployDir(t), "00-namespace.yaml"))
	out = kubectl(t, "apply", "--server-side", "--dry-run=server", "--field-manager=berth-test", "-f", deployDir(t))
	for _, obj := range []string{"namespace/berth", "serviceaccount/berth-api", "serviceaccount/berth-node",
		"role.rbac.authorization.k8s.io/berth-api", "role.rbac.authorization.k8s.io/berth-node",
		"rolebinding.rbac.authorization.k8s.io/berth-api", "rolebinding.rbac.authorization.k8s.io/berth-node",
		"deployment.apps/berth-api", "service/berth-api", "daemonset.apps/berth-node",
		"validatingadmissionpolicy.admissionregistration.k8s.io/berth-node-writes-its-own",
		"validatingadmissionpolicybinding.admissionregistration.k8s.io/berth-node-writes-its-own"} {
		if !strings.Contains(out, obj+" serverside-applied (server dry run)") {
			t.Errorf("%s not in the dry run's output:\n%s", obj, out)
		}
	}
	if strings.Contains(strings.ToLower(out), "warning") {
		t.Errorf("the dry run warned:\n%s", out)
	}
	// A dry run writes nothing.
	var d map[string]any
	err := srv.Client.Get(context.Background(), kube.Resource{Group: "apps", Version: "v1", Plural: "deployments", Namespaced: true}, ns, "berth-api", &d)
	if !errs.Is(err, errs.NotFound) {
		t.Errorf("deployment after a dry run: %v", err)
	}
	// kubectl reads the printer columns.
	out = kubectl(t, "get", "sandboxes", "-n", ns)
	if !strings.Contains(out, "No resources") {
		t.Errorf("kubectl get sandboxes: %s", out)
	}
}

func as(t *testing.T, token string) *kube.Client {
	t.Helper()
	cfg := srv.Config
	cfg.Token, cfg.Namespace = token, ns
	kc, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// step is one request and whether RBAC must allow it.
type step struct {
	what  string
	allow bool
	do    func(ctx context.Context, kc *kube.Client) error
}

func run(t *testing.T, who string, kc *kube.Client, steps []step) {
	t.Helper()
	ctx := context.Background()
	for _, s := range steps {
		err := s.do(ctx, kc)
		switch {
		case s.allow && err != nil:
			t.Errorf("%s: %s: %v (want allowed)", who, s.what, err)
		case !s.allow && !errs.Is(err, errs.PermissionDenied):
			t.Errorf("%s: %s: %v (want 403 PermissionDenied)", who, s.what, err)
		}
	}
}

func sandboxObj(name, node string) *berthv1.Sandbox {
	return &berthv1.Sandbox{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Sandbox"},
		ObjectMeta: kube.ObjectMeta{Name: name, Labels: map[string]string{berthv1.LabelNode: node}},
		Spec:       berthv1.SandboxSpec{Owner: "alice", Template: "tiny", NodeName: node},
		Status:     berthv1.SandboxStatus{State: "creating"}}
}

func updateSandbox(ctx context.Context, kc *kube.Client, name, state string) error {
	var sb berthv1.Sandbox
	if err := kc.Get(ctx, berthv1.Sandboxes, ns, name, &sb); err != nil {
		return err
	}
	sb.Status.State = state
	return kc.Update(ctx, berthv1.Sandboxes, ns, name, &sb, nil)
}

func lease(name string) *kube.Lease {
	holder, secs := name, int32(40)
	now := kube.MicroTime{Time: time.Now()}
	return &kube.Lease{TypeMeta: kube.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: kube.ObjectMeta{Name: berthv1.NodeLeaseName(name)},
		Spec:       kube.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &now}}
}

func record(name string) *berthv1.Record {
	return &berthv1.Record{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Record"},
		ObjectMeta: kube.ObjectMeta{Name: name, Labels: map[string]string{berthv1.LabelTable: "events"}},
		Spec:       berthv1.RecordSpec{Table: "events", Key: name, Seq: 1, Data: "{}"}}
}

func secret(name string) *kube.Secret {
	return &kube.Secret{TypeMeta: kube.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: kube.ObjectMeta{Name: name}, Data: map[string][]byte{"k": []byte("v")}}
}

// TestRBAC applies the Roles for real and, as each service account (a
// static token for the user its pods' tokens name), does what it needs
// (allowed) and what it must never do (403).
func TestRBAC(t *testing.T) {
	applyReal(t)
	ctx := context.Background()
	admin := srv.Client
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.Create(ctx, kube.Secrets, ns, secret("someone-elses"), nil))
	must(admin.Create(ctx, berthv1.Sandboxes, ns, sandboxObj("sbxn1", "n1"), nil))
	must(admin.Create(ctx, berthv1.Sandboxes, ns, sandboxObj("sbxa1", "n1"), nil))
	must(admin.Create(ctx, berthv1.Nodes, ns, &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
		ObjectMeta: kube.ObjectMeta{Name: "n2"}}, nil))
	must(admin.Create(ctx, kube.Leases, ns, lease("n2"), nil))
	other := srv.Namespace(t)
	must(admin.Create(ctx, berthv1.Sandboxes, other, sandboxObj("elsewhere", "n1"), nil))

	t.Run("berth-node", func(t *testing.T) {
		node := &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"}, ObjectMeta: kube.ObjectMeta{Name: "n1"}}
		run(t, "berth-node", as(t, nodeToken), []step{
			{"create its Node", true, func(ctx context.Context, kc *kube.Client) error { return kc.Create(ctx, berthv1.Nodes, ns, node, node) }},
			{"update its Node's status", true, func(ctx context.Context, kc *kube.Client) error {
				now := time.Now().UTC().Truncate(time.Second)
				node.Status = berthv1.NodeStatus{Address: "https://10.0.0.1:7443", Heartbeat: &now,
					Capacity: berthv1.Resources{CPUMillis: 2000, MemoryMiB: 4096}}
				return kc.UpdateStatus(ctx, berthv1.Nodes, ns, "n1", node, node)
			}},
			{"update its Node", true, func(ctx context.Context, kc *kube.Client) error {
				node.Labels = map[string]string{"zone": "a"}
				return kc.Update(ctx, berthv1.Nodes, ns, "n1", node, node)
			}},
			{"create its Lease", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, kube.Leases, ns, lease("n1"), nil)
			}},
			{"renew its Lease", true, func(ctx context.Context, kc *kube.Client) error {
				var l kube.Lease
				if err := kc.Get(ctx, kube.Leases, ns, berthv1.NodeLeaseName("n1"), &l); err != nil {
					return err
				}
				l.Spec.RenewTime = &kube.MicroTime{Time: time.Now()}
				return kc.Update(ctx, kube.Leases, ns, l.Name, &l, nil)
			}},
			{"list the sandboxes bound to it", true, func(ctx context.Context, kc *kube.Client) error {
				var l berthv1.SandboxList
				if err := kc.List(ctx, berthv1.Sandboxes, ns, kube.ListOptions{LabelSelector: berthv1.LabelNode + "=n1"}, &l); err != nil {
					return err
				}
				if len(l.Items) != 2 {
					return fmt.Errorf("%d sandboxes, want 2", len(l.Items))
				}
				return nil
			}},
			{"list the Nodes (layer sources of a template it lacks)", true, func(ctx context.Context, kc *kube.Client) error {
				var l berthv1.NodeList
				return kc.List(ctx, berthv1.Nodes, ns, kube.ListOptions{}, &l)
			}},
			{"mirror a sandbox's state", true, func(ctx context.Context, kc *kube.Client) error { return updateSandbox(ctx, kc, "sbxn1", "running") }},
			{"publish a template", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.Templates, ns, &berthv1.Template{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Template"},
					ObjectMeta: kube.ObjectMeta{Name: "tiny"}, Spec: berthv1.TemplateSpec{Name: "tiny"}}, nil)
			}},
			{"append an event record", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.Records, ns, record("ev-node-1"), nil)
			}},
			{"get or create the cluster token", true, func(ctx context.Context, kc *kube.Client) error { _, err := peer.EnsureToken(ctx, kc, ns); return err }},
			{"get or create the secrets' data key", true, func(ctx context.Context, kc *kube.Client) error {
				_, err := kubestore.EnsureSecretsKey(ctx, kc, ns)
				return err
			}},
			{"watch the secrets' records", true, func(ctx context.Context, kc *kube.Client) error {
				w, err := kc.Watch(ctx, berthv1.Records, ns, kube.ListOptions{LabelSelector: berthv1.LabelTable + "=" + kubestore.SecretsTable, TimeoutSeconds: 1})
				if err == nil {
					w.Close()
				}
				return err
			}},
			{"delete a sandbox", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Delete(ctx, berthv1.Sandboxes, ns, "sbxn1", kube.DeleteOptions{})
			}},
			{"create a sandbox", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.Sandboxes, ns, sandboxObj("forged", "n1"), nil)
			}},
			{"delete a record", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Delete(ctx, berthv1.Records, ns, "ev-node-1", kube.DeleteOptions{})
			}},
			{"delete a Node", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Delete(ctx, berthv1.Nodes, ns, "n2", kube.DeleteOptions{})
			}},
			{"list Leases", false, func(ctx context.Context, kc *kube.Client) error {
				var l map[string]any
				return kc.List(ctx, kube.Leases, ns, kube.ListOptions{}, &l)
			}},
			{"read another secret", false, func(ctx context.Context, kc *kube.Client) error {
				var s kube.Secret
				return kc.Get(ctx, kube.Secrets, ns, "someone-elses", &s)
			}},
			{"list secrets", false, func(ctx context.Context, kc *kube.Client) error {
				var l map[string]any
				return kc.List(ctx, kube.Secrets, ns, kube.ListOptions{}, &l)
			}},
			{"read sandboxes of another namespace", false, func(ctx context.Context, kc *kube.Client) error {
				var sb berthv1.Sandbox
				return kc.Get(ctx, berthv1.Sandboxes, other, "elsewhere", &sb)
			}},
			{"write a WarmPool", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.WarmPools, ns, &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"},
					ObjectMeta: kube.ObjectMeta{Name: "p"}, Spec: berthv1.WarmPoolSpec{Template: "tiny"}}, nil)
			}},
		})
	})

	t.Run("berth-api", func(t *testing.T) {
		run(t, "berth-api", as(t, apiToken), []step{
			{"create a bound sandbox", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.Sandboxes, ns, sandboxObj("sbxa2", "n1"), nil)
			}},
			{"update a sandbox", true, func(ctx context.Context, kc *kube.Client) error { return updateSandbox(ctx, kc, "sbxa2", "lost") }},
			{"delete a sandbox", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Delete(ctx, berthv1.Sandboxes, ns, "sbxa2", kube.DeleteOptions{})
			}},
			{"write records", true, func(ctx context.Context, kc *kube.Client) error {
				if err := kc.Create(ctx, berthv1.Records, ns, record("key-1"), nil); err != nil {
					return err
				}
				return kc.Delete(ctx, berthv1.Records, ns, "key-1", kube.DeleteOptions{})
			}},
			{"write a WarmPool", true, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.WarmPools, ns, &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"},
					ObjectMeta: kube.ObjectMeta{Name: "p"}, Spec: berthv1.WarmPoolSpec{Template: "tiny", Min: 1, Max: 2}}, nil)
			}},
			{"list Nodes and Leases", true, func(ctx context.Context, kc *kube.Client) error {
				var n berthv1.NodeList
				var l map[string]any
				if err := kc.List(ctx, berthv1.Nodes, ns, kube.ListOptions{}, &n); err != nil {
					return err
				}
				return kc.List(ctx, kube.Leases, ns, kube.ListOptions{}, &l)
			}},
			{"mark a Node lost (status)", true, func(ctx context.Context, kc *kube.Client) error {
				var n berthv1.Node
				if err := kc.Get(ctx, berthv1.Nodes, ns, "n2", &n); err != nil {
					return err
				}
				kube.SetCondition(&n.Status.Conditions, kube.Condition{Type: berthv1.CondNodeReady, Status: "False",
					Reason: "LeaseExpired", LastTransitionTime: time.Now().UTC().Truncate(time.Second)})
				return kc.UpdateStatus(ctx, berthv1.Nodes, ns, "n2", &n, nil)
			}},
			{"get or create the cluster token", true, func(ctx context.Context, kc *kube.Client) error { _, err := peer.EnsureToken(ctx, kc, ns); return err }},
			{"get or create the secrets' data key", true, func(ctx context.Context, kc *kube.Client) error {
				_, err := kubestore.EnsureSecretsKey(ctx, kc, ns)
				return err
			}},
			{"create a Node", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, berthv1.Nodes, ns, &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
					ObjectMeta: kube.ObjectMeta{Name: "forged"}}, nil)
			}},
			{"change a Node's spec", false, func(ctx context.Context, kc *kube.Client) error {
				var n berthv1.Node
				if err := kc.Get(ctx, berthv1.Nodes, ns, "n2", &n); err != nil {
					return err
				}
				n.Spec.Unschedulable = true
				return kc.Update(ctx, berthv1.Nodes, ns, "n2", &n, nil)
			}},
			{"renew a node's Lease", false, func(ctx context.Context, kc *kube.Client) error {
				var l kube.Lease
				if err := kc.Get(ctx, kube.Leases, ns, berthv1.NodeLeaseName("n2"), &l); err != nil {
					return err
				}
				l.Spec.RenewTime = &kube.MicroTime{Time: time.Now()}
				return kc.Update(ctx, kube.Leases, ns, l.Name, &l, nil)
			}},
			{"create a Lease", false, func(ctx context.Context, kc *kube.Client) error {
				return kc.Create(ctx, kube.Leases, ns, lease("n9"), nil)
			}},
			{"read another secret", false, func(ctx context.Context, kc *kube.Client) error {
				var s kube.Secret
				return kc.Get(ctx, kube.Secrets, ns, "someone-elses", &s)
			}},
			{"list secrets", false, func(ctx context.Context, kc *kube.Client) error {
				var l map[string]any
				return kc.List(ctx, kube.Secrets, ns, kube.ListOptions{}, &l)
			}},
			{"read sandboxes of another namespace", false, func(ctx context.Context, kc *kube.Client) error {
				var sb berthv1.Sandbox
				return kc.Get(ctx, berthv1.Sandboxes, other, "elsewhere", &sb)
			}},
		})
	})

	// Both ended up with the same token: the one Secret.
	a, err := peer.EnsureToken(ctx, as(t, apiToken), ns)
	must(err)
	b, err := peer.EnsureToken(ctx, as(t, nodeToken), ns)
	must(err)
	if a != b {
		t.Error("the two accounts read different cluster tokens")
	}
	// ...and the same data key: what a replica seals, a node opens.
	sa, err := kubestore.EnsureSecretsKey(ctx, as(t, apiToken), ns)
	must(err)
	sn, err := kubestore.EnsureSecretsKey(ctx, as(t, nodeToken), ns)
	must(err)
	sealed, err := sa.Seal("alice", "TOKEN", []byte("s3cret"))
	must(err)
	if v, err := sn.Open(store.Secret{Owner: "alice", Name: "TOKEN", Sealed: sealed}); err != nil || string(v) != "s3cret" {
		t.Errorf("the node opened the replica's sealed value as %q, %v", v, err)
	}
}

// TestSchemaKeepsEveryField: a fully populated object of each kind comes
// back from the API server as it went in. A field the CRD does not name
// would be pruned (silently) and show up here as a diff.
func TestSchemaKeepsEveryField(t *testing.T) {
	ctx := context.Background()
	nsx := srv.Namespace(t)
	kc := srv.Client
	at := func(s int) *time.Time { v := time.Date(2026, 12, 1, 10, 0, s, 0, time.UTC); return &v }
	cond := []kube.Condition{{Type: "Ready", Status: "True", ObservedGeneration: 1, LastTransitionTime: *at(1), Reason: "Running", Message: "answering"}}
	res := berthv1.Resources{CPUMillis: 1500, MemoryMiB: 512, DiskMiB: 2048, Pids: 256}
	tm := kube.TypeMeta{APIVersion: berthv1.APIVersion}
	sb := &berthv1.Sandbox{TypeMeta: tm, ObjectMeta: kube.ObjectMeta{Name: "full", Annotations: map[string]string{"berth.dev/extra": `{"env":{"A":"1"}}`}},
		Spec: berthv1.SandboxSpec{Owner: "alice", Template: "tiny", TemplateFingerprint: "sha256-abc", Runtime: "runsc", Resources: res,
			Labels: map[string]string{"task": "lint run"}, ExpiresAt: at(2), ExpiryAction: "pause", ExpectedDuration: "1h30m",
			DurationClass: "long", Network: &berthv1.NetworkPolicy{Mode: "rules", Allow: []string{"pypi.org:443"}, Deny: []string{"10.0.0.0/8"}, Secrets: []string{"gh"}},
			NodeName: "n1"},
		Status: berthv1.SandboxStatus{State: "paused", Reason: "user", PauseMode: "memory", Node: "n1", IP: "10.200.0.7",
			Timings:    berthv1.SandboxTimings{CreatedAt: at(3), BoundAt: at(4), StartedAt: at(5), PausedAt: at(6), LostAt: at(7)},
			Conditions: cond, ObservedGeneration: 3}}
	sb.Kind = "Sandbox"
	node := &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"}, ObjectMeta: kube.ObjectMeta{Name: "n1"},
		Spec: berthv1.NodeSpec{Unschedulable: true}}
	nodeStatus := berthv1.NodeStatus{Address: "https://10.0.0.1:7443", CertSHA256: strings.Repeat("ab", 32), Capacity: res, Allocated: res,
		Runtimes:        []berthv1.NodeRuntime{{Name: "runc", Capabilities: []string{"memory-checkpoint"}}, {Name: "runsc"}},
		CachedTemplates: []string{"sha256-abc"}, WarmPools: []berthv1.NodeWarmPool{{Fingerprint: "sha256-abc", Ready: 2}},
		Version: "dev", Heartbeat: at(8), Conditions: cond}
	tpl := &berthv1.Template{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Template"}, ObjectMeta: kube.ObjectMeta{Name: "tiny"},
		Spec: berthv1.TemplateSpec{Name: "tiny", Source: "docker.io/library/busybox", StartCmd: []string{"sleep", "inf"}, Env: map[string]string{"A": "1"},
			Workdir: "/root", User: "root", Resources: res},
		Status: berthv1.TemplateStatus{State: "ready", Fingerprint: "sha256-abc", Layers: []string{"sha256-1", "sha256-2"}, Progress: "done", Error: "none", Conditions: cond}}
	pool := &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"}, ObjectMeta: kube.ObjectMeta{Name: "tiny"},
		Spec:   berthv1.WarmPoolSpec{Template: "tiny", Runtime: "runc", Resources: res, Min: 1, Max: 4},
		Status: berthv1.WarmPoolStatus{Ready: 3, PerNode: map[string]int32{"n1": 3}, Conditions: cond}}
	rec := record("full")

	check := func(kind string, r kube.Resource, in, out any, status func()) {
		t.Helper()
		if err := kc.Create(ctx, r, nsx, in, out); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if status != nil {
			status()
		}
	}
	var gotSB berthv1.Sandbox
	check("Sandbox", berthv1.Sandboxes, sb, &gotSB, nil)
	var gotNode berthv1.Node
	check("Node", berthv1.Nodes, node, &gotNode, func() {
		gotNode.Status = nodeStatus
		if err := kc.UpdateStatus(ctx, berthv1.Nodes, nsx, "n1", &gotNode, &gotNode); err != nil {
			t.Fatalf("Node status: %v", err)
		}
	})
	var gotTpl berthv1.Template
	check("Template", berthv1.Templates, tpl, &gotTpl, nil)
	var gotPool berthv1.WarmPool
	check("WarmPool", berthv1.WarmPools, pool, &gotPool, nil)
	var gotRec berthv1.Record
	check("Record", berthv1.Records, rec, &gotRec, nil)

	for _, c := range []struct {
		kind      string
		want, got any
	}{
		{"Sandbox", sb.Spec, gotSB.Spec}, {"Sandbox status", sb.Status, gotSB.Status},
		{"Sandbox annotations", sb.Annotations, gotSB.Annotations},
		{"Node", node.Spec, gotNode.Spec}, {"Node status", nodeStatus, gotNode.Status},
		{"Template", tpl.Spec, gotTpl.Spec}, {"Template status", tpl.Status, gotTpl.Status},
		{"WarmPool", pool.Spec, gotPool.Spec}, {"WarmPool status", pool.Status, gotPool.Status},
		{"Record", rec.Spec, gotRec.Spec},
	} {
		if d := cmp.Diff(c.want, c.got); d != "" {
			t.Errorf("%s lost fields on the way through the API server (-sent +read):\n%s", c.kind, d)
		}
	}
}

// TestSchemaRefuses: the API server's validation names the field and the
// allowed values, and lets through every state berth has (pending and lost
// included).
func TestSchemaRefuses(t *testing.T) {
	ctx := context.Background()
	nsx := srv.Namespace(t)
	for i, st := range []string{"pending", "creating", "running", "pausing", "paused", "resuming", "stopped", "failed", "deleted", "lost"} {
		sb := sandboxObj(fmt.Sprintf("ok%d", i), "n1")
		sb.Status.State = st
		if err := srv.Client.Create(ctx, berthv1.Sandboxes, nsx, sb, nil); err != nil {
			t.Errorf("state %s refused: %v", st, err)
		}
	}
	for i, tc := range []struct {
		field string
		mut   func(*berthv1.Sandbox)
	}{
		{"status.state", func(s *berthv1.Sandbox) { s.Status.State = "zombie" }},
		{"spec.runtime", func(s *berthv1.Sandbox) { s.Spec.Runtime = "docker" }},
		{"spec.expiryAction", func(s *berthv1.Sandbox) { s.Spec.ExpiryAction = "explode" }},
		{"spec.durationClass", func(s *berthv1.Sandbox) { s.Spec.DurationClass = "forever" }},
		{"spec.expectedDuration", func(s *berthv1.Sandbox) { s.Spec.ExpectedDuration = "5 minutes" }},
		{"spec.resources.memoryMiB", func(s *berthv1.Sandbox) { s.Spec.Resources.MemoryMiB = -1 }},
		{"spec.owner", func(s *berthv1.Sandbox) { s.Spec.Owner = "" }},
		{"status.pauseMode", func(s *berthv1.Sandbox) { s.Status.PauseMode = "nap" }},
		{"spec.network.mode", func(s *berthv1.Sandbox) { s.Spec.Network = &berthv1.NetworkPolicy{Mode: "open"} }},
	} {
		sb := sandboxObj(fmt.Sprintf("bad%d", i), "n1")
		tc.mut(sb)
		err := srv.Client.Create(ctx, berthv1.Sandboxes, nsx, sb, nil)
		if !errs.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want InvalidArgument naming it", tc.field, err)
		}
	}
	pool := &berthv1.WarmPool{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "WarmPool"}, ObjectMeta: kube.ObjectMeta{Name: "p"},
		Spec: berthv1.WarmPoolSpec{Template: "tiny", Min: 5, Max: 2}}
	if err := srv.Client.Create(ctx, berthv1.WarmPools, nsx, pool, nil); !errs.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), "spec.min") {
		t.Errorf("min > max: %v", err)
	}
	var n berthv1.Node
	if err := srv.Client.Create(ctx, berthv1.Nodes, nsx, &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
		ObjectMeta: kube.ObjectMeta{Name: "nx"}}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.CertSHA256 = "not-hex"
	if err := srv.Client.UpdateStatus(ctx, berthv1.Nodes, nsx, "nx", &n, nil); !errs.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), "status.certSHA256") {
		t.Errorf("bad certSHA256: %v", err)
	}
}

// TestNodePolicy: with deploy/15-node-policy.yaml in force, a node agent
// holding its pod's token (bound to a pod on Kubernetes node k8s-a, as a
// DaemonSet pod's is) writes its own Node object and Lease and is refused
// another node's; a berth-node token bound to no pod is refused outright.
func TestNodePolicy(t *testing.T) {
	applyReal(t)
	ctx := context.Background()
	admin := srv.Client
	policy := filepath.Join(deployDir(t), "15-node-policy.yaml")
	kubectl(t, "apply", "--server-side", "--field-manager=berth-test", "-f", policy)
	t.Cleanup(func() { kubectl(t, "delete", "-f", policy) })
	// The API server loads a new policy asynchronously: wait until it refuses.
	probe := 0
	testutil.Eventually(t, testutil.Within(30*time.Second).Every(200*time.Millisecond), func() error {
		probe++
		name := fmt.Sprintf("probe%d", probe)
		err := as(t, nodeToken).Create(ctx, berthv1.Nodes, ns, &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"},
			ObjectMeta: kube.ObjectMeta{Name: name}}, nil)
		if err == nil {
			_ = srv.Client.Delete(ctx, berthv1.Nodes, ns, name, kube.DeleteOptions{})
			return fmt.Errorf("policy not in force yet")
		}
		return nil
	})

	coreNodes := kube.Resource{Version: "v1", Plural: "nodes"}
	pods := kube.Resource{Version: "v1", Plural: "pods", Namespaced: true}
	if err := admin.Create(ctx, coreNodes, "", map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": "k8s-a"}}, nil); err != nil && !errs.Is(err, errs.AlreadyExists) {
		t.Fatal(err)
	}
	var pod struct {
		Metadata struct{ Name, UID string } `json:"metadata"`
	}
	if err := admin.Create(ctx, pods, ns, map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "berth-node-k8s-a"},
		"spec": map[string]any{"serviceAccountName": "berth-node", "nodeName": "k8s-a",
			"containers": []any{map[string]any{"name": "berth", "image": "berth:dev"}}}}, &pod); err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := admin.Do(ctx, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/berth-node/token", nil, map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600,
			"boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod.Metadata.Name, "uid": pod.Metadata.UID}},
	}, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("token request: %v", err)
	}
	podNode := as(t, tr.Status.Token)
	nodeObj := func(name string) *berthv1.Node {
		return &berthv1.Node{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Node"}, ObjectMeta: kube.ObjectMeta{Name: name}}
	}
	var own berthv1.Node
	if err := podNode.Create(ctx, berthv1.Nodes, ns, nodeObj("k8s-a"), &own); err != nil {
		t.Fatalf("own Node: %v", err)
	}
	own.Status.Address = "https://10.0.0.5:7443"
	if err := podNode.UpdateStatus(ctx, berthv1.Nodes, ns, "k8s-a", &own, nil); err != nil {
		t.Errorf("own Node status: %v", err)
	}
	if err := podNode.Create(ctx, kube.Leases, ns, lease("k8s-a"), nil); err != nil {
		t.Errorf("own Lease: %v", err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "may write only") && !strings.Contains(err.Error(), "node-name") {
			t.Errorf("%s: %v, want refused by the policy", what, err)
		}
	}
	refused("another node's Node", podNode.Create(ctx, berthv1.Nodes, ns, nodeObj("k8s-b"), nil))
	refused("another node's Lease", podNode.Create(ctx, kube.Leases, ns, lease("k8s-b"), nil))
	// The admin put n2's Node in TestRBAC; a pod-bound agent cannot touch it.
	var other berthv1.Node
	if err := admin.Get(ctx, berthv1.Nodes, ns, "n2", &other); err == nil {
		other.Status.Address = "https://evil:1"
		refused("another node's status", podNode.UpdateStatus(ctx, berthv1.Nodes, ns, "n2", &other, nil))
	}
	// A berth-node token bound to no pod (the static one) names no node.
	refused("unbound token", as(t, nodeToken).Create(ctx, berthv1.Nodes, ns, nodeObj("k8s-c"), nil))
}

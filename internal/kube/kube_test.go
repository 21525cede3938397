package kube_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
)

var srv *kubetest.Server

func TestMain(m *testing.M) { kubetest.Main(m, func(s *kubetest.Server) { srv = s }) }

func record(ns, name, data string) *berthv1.Record {
	return &berthv1.Record{
		TypeMeta:   kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Record"},
		ObjectMeta: kube.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{berthv1.LabelTable: "t"}},
		Spec:       berthv1.RecordSpec{Table: "t", Key: name, Data: data},
	}
}

// The verbs against the real API server, and the error kinds they map to.
func TestCRUDAndErrorKinds(t *testing.T) {
	ctx := t.Context()
	ns := srv.Namespace(t)
	kc := srv.Client
	var got berthv1.Record
	if err := kc.Get(ctx, berthv1.Records, ns, "a", &got); !errs.Is(err, errs.NotFound) {
		t.Fatalf("get missing: %v, want NotFound", err)
	}
	if err := kc.Create(ctx, berthv1.Records, ns, record(ns, "a", "1"), &got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion == "" || got.UID == "" {
		t.Fatalf("create answer has no resourceVersion/uid: %+v", got.ObjectMeta)
	}
	if err := kc.Create(ctx, berthv1.Records, ns, record(ns, "a", "1"), nil); !errs.Is(err, errs.AlreadyExists) {
		t.Fatalf("create twice: %v, want AlreadyExists", err)
	}
	stale := got
	got.Spec.Data = "2"
	if err := kc.Update(ctx, berthv1.Records, ns, "a", &got, &got); err != nil {
		t.Fatal(err)
	}
	stale.Spec.Data = "3"
	if err := kc.Update(ctx, berthv1.Records, ns, "a", &stale, nil); !errs.Is(err, errs.Conflict) {
		t.Fatalf("update with a stale resourceVersion: %v, want Conflict", err)
	}
	if err := kc.Patch(ctx, berthv1.Records, ns, "a", kube.MergePatch, []byte(`{"spec":{"data":"4"}}`), "", &got); err != nil || got.Spec.Data != "4" {
		t.Fatalf("merge patch: %v %q", err, got.Spec.Data)
	}
	if err := kc.Delete(ctx, berthv1.Records, ns, "a", kube.DeleteOptions{ResourceVersion: stale.ResourceVersion}); !errs.Is(err, errs.Conflict) {
		t.Fatalf("delete with a stale precondition: %v, want Conflict", err)
	}
	if err := kc.Delete(ctx, berthv1.Records, ns, "a", kube.DeleteOptions{ResourceVersion: got.ResourceVersion}); err != nil {
		t.Fatal(err)
	}
	if err := kc.Delete(ctx, berthv1.Records, ns, "a", kube.DeleteOptions{}); !errs.Is(err, errs.NotFound) {
		t.Fatalf("delete missing: %v, want NotFound", err)
	}
	bad := record(ns, "Not_A_DNS_Name", "x")
	if err := kc.Create(ctx, berthv1.Records, ns, bad, nil); !errs.Is(err, errs.InvalidArgument) {
		t.Fatalf("bad name: %v, want InvalidArgument", err)
	}
	other, err := kube.New(kube.Config{Server: srv.Config.Server, Token: "wrong", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Get(ctx, berthv1.Records, ns, "a", nil); !errs.Is(err, errs.Unauthenticated) {
		t.Fatalf("bad token: %v, want Unauthenticated", err)
	}
}

func TestListPagesAndSelectors(t *testing.T) {
	ctx := t.Context()
	ns := srv.Namespace(t)
	for i := range 7 {
		r := record(ns, "r"+string(rune('a'+i)), "x")
		if i%2 == 0 {
			r.Labels["even"] = "yes"
		}
		if err := srv.Client.Create(ctx, berthv1.Records, ns, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	opts := kube.ListOptions{LabelSelector: "even=yes", Limit: 2}
	for {
		var l berthv1.RecordList
		if err := srv.Client.List(ctx, berthv1.Records, ns, opts, &l); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) > 2 {
			t.Fatalf("page of %d, limit 2", len(l.Items))
		}
		for _, it := range l.Items {
			names = append(names, it.Name)
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	if len(names) != 4 {
		t.Fatalf("even records over pages: %v", names)
	}
}

func TestWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ns := srv.Namespace(t)
	var l berthv1.RecordList
	if err := srv.Client.List(ctx, berthv1.Records, ns, kube.ListOptions{}, &l); err != nil {
		t.Fatal(err)
	}
	w, err := srv.Client.Watch(ctx, berthv1.Records, ns, kube.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := srv.Client.Create(ctx, berthv1.Records, ns, record(ns, "w", "1"), nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.Delete(ctx, berthv1.Records, ns, "w", kube.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for len(seen) < 2 {
		ev, err := w.Next()
		if err == io.EOF {
			t.Fatal("watch ended early")
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == kube.Bookmark {
			continue
		}
		var r berthv1.Record
		if err := json.Unmarshal(ev.Object, &r); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ev.Type+" "+r.Name)
	}
	if seen[0] != "ADDED w" || seen[1] != "DELETED w" {
		t.Fatalf("events %v", seen)
	}
}

func TestLeaseRoundTrip(t *testing.T) {
	ctx := t.Context()
	ns := srv.Namespace(t)
	holder, dur := "n1", int32(15)
	now := kube.MicroTime{Time: time.Now().Truncate(time.Microsecond)}
	l := kube.Lease{TypeMeta: kube.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: kube.ObjectMeta{Name: berthv1.NodeLeaseName("n1"), Namespace: ns},
		Spec:       kube.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &now}}
	var got kube.Lease
	if err := srv.Client.Create(ctx, kube.Leases, ns, &l, &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.RenewTime == nil || !got.Spec.RenewTime.Equal(now.Time) {
		t.Fatalf("renewTime %v, want %v", got.Spec.RenewTime, now.Time)
	}
}

// A kubeconfig written by Config.Kubeconfig reads back as the same config.
func TestKubeconfigRoundTrip(t *testing.T) {
	p := srv.Kubeconfig(t, "", "berth")
	cfg, err := kube.LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server != srv.Config.Server || cfg.Token != kubetest.AdminToken || cfg.Namespace != "berth" || !cfg.Insecure {
		t.Fatalf("config %+v", cfg)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("current-context: nope\ncontexts: []\n"), 0o600)
	if _, err := kube.LoadConfig(bad); errs.FieldOf(err) != "current-context" {
		t.Fatalf("bad kubeconfig: %v (field %q)", err, errs.FieldOf(err))
	}
}

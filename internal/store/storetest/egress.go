package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

func suiteEgressLog(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := []store.EgressEntry{
		{SandboxID: "a", Owner: "alice", Time: suiteEpoch, Proto: "tcp", DstIP: "203.0.113.10", DstPort: 443,
			Host: "good.test", Rule: "allow:good.test", Verdict: "allow", Intercepted: true, BytesOut: 10, BytesIn: 20,
			Duration: 1500 * time.Millisecond},
		{SandboxID: "b", Owner: "bob", Time: suiteEpoch.Add(time.Second), Proto: "dns", Host: "x.test", Rule: "default-deny", Verdict: "deny"},
		{SandboxID: "a", Owner: "alice", Time: suiteEpoch.Add(2 * time.Second), Proto: "tcp", DstIP: "203.0.113.11", DstPort: 80,
			Rule: "default-deny", Verdict: "deny", Reason: "no-host"},
	}
	if err := s.AppendEgress(ctx, in[:1]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEgress(ctx, in[1:]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEgress(ctx, []store.EgressEntry{{Proto: "tcp"}}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("AppendEgress without sandbox id: err = %v, want InvalidArgument", err)
	}
	got, err := s.ListEgress(ctx, store.EgressFilter{SandboxID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq >= got[1].Seq {
		t.Fatalf("ListEgress(a) = %+v, want 2 entries in seq order", got)
	}
	want := []store.EgressEntry{in[0], in[2]}
	for i := range got {
		want[i].Seq = got[i].Seq
	}
	if d := cmp.Diff(want, got, suiteOpts); d != "" {
		t.Errorf("ListEgress(a) (-want +got):\n%s", d)
	}
	after, err := s.ListEgress(ctx, store.EgressFilter{AfterSeq: got[0].Seq, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || after[0].SandboxID != "b" {
		t.Errorf("ListEgress(after first, limit 1) = %+v, want the entry of b", after)
	}
}

func suiteSecrets(t *testing.T, s store.Store) {
	ctx := t.Context()
	sec := store.Secret{Owner: "alice", Name: "GH", Host: "api.github.com", Header: "Authorization: Bearer {{value}}",
		Sealed: []byte{1, 2, 3}, CreatedAt: suiteEpoch, UpdatedAt: suiteEpoch}
	if _, err := s.PutSecret(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSecret(ctx, store.Secret{Owner: "bob", Name: "GH", Host: "h", Sealed: []byte{9}}); err != nil {
		t.Fatal(err)
	}
	upd := sec
	upd.Sealed, upd.Host, upd.CreatedAt, upd.UpdatedAt = []byte{4}, "api2.github.com", time.Time{}, suiteEpoch.Add(time.Hour)
	stored, err := s.PutSecret(ctx, upd)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.CreatedAt.Equal(suiteEpoch) {
		t.Errorf("replace kept CreatedAt %v, want %v", stored.CreatedAt, suiteEpoch)
	}
	got, err := s.GetSecret(ctx, "alice", "GH")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(stored, got, suiteOpts); d != "" {
		t.Errorf("GetSecret (-want +got):\n%s", d)
	}
	if _, err := s.GetSecret(ctx, "carol", "GH"); !errs.Is(err, errs.NotFound) {
		t.Errorf("GetSecret(carol): err = %v, want NotFound", err)
	}
	if _, err := s.PutSecret(ctx, store.Secret{Owner: "alice", Name: "X", Host: "h"}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("PutSecret without value: err = %v, want InvalidArgument", err)
	}
	list, err := s.ListSecrets(ctx, "alice")
	if err != nil || len(list) != 1 || list[0].Name != "GH" {
		t.Errorf("ListSecrets(alice) = %+v, %v", list, err)
	}
	if all, _ := s.ListSecrets(ctx, ""); len(all) != 2 {
		t.Errorf("ListSecrets(all) = %d secrets, want 2", len(all))
	}
	if err := s.DeleteSecret(ctx, "alice", "GH"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, "alice", "GH"); !errs.Is(err, errs.NotFound) {
		t.Errorf("second DeleteSecret: err = %v, want NotFound", err)
	}
}

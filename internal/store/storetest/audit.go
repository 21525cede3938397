package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// suiteAudit: the audit chain's rows keep what was appended, in seq order,
// continue only from the stored end, carry the head with them, and survive
// the deletion of their sandbox.
func suiteAudit(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.AuditHead(ctx); errs.KindOf(err) != errs.NotFound {
		t.Fatalf("AuditHead of an empty chain: err = %v, want NotFound", err)
	}
	if _, err := s.AuditLast(ctx); errs.KindOf(err) != errs.NotFound {
		t.Fatalf("AuditLast of an empty chain: err = %v, want NotFound", err)
	}
	sb := suiteSandbox("auditsb", "alice", suiteEpoch)
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	in := []store.AuditEntry{
		{Seq: 1, Time: suiteEpoch, Actor: "alice", Action: "api", SandboxID: "auditsb", Owner: "alice",
			Data: map[string]string{"method": "POST", "status": "200"}, PrevHash: "00", Hash: "h1", MAC: "m1"},
		{Seq: 2, Time: suiteEpoch.Add(time.Second), Actor: "berth", Action: "sandbox.paused", SandboxID: "auditsb", Owner: "alice",
			Data: map[string]string{}, PrevHash: "h1", Hash: "h2"},
		{Seq: 3, Time: suiteEpoch.Add(2 * time.Second), Actor: "bob", Action: "api", Owner: "bob",
			Data: map[string]string{"route": "GET /v1/sandboxes"}, PrevHash: "h2", Hash: "h3"},
	}
	if err := s.AppendAudit(ctx, in[:1], store.AuditHead{Seq: 1, Hash: "h1", MAC: "m1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAudit(ctx, in[2:], store.AuditHead{Seq: 3, Hash: "h3", MAC: "m3"}); errs.KindOf(err) != errs.Conflict {
		t.Errorf("AppendAudit leaving a gap: err = %v, want Conflict", err)
	}
	if err := s.AppendAudit(ctx, in[:1], store.AuditHead{Seq: 1, Hash: "h1", MAC: "m1"}); errs.KindOf(err) != errs.Conflict {
		t.Errorf("AppendAudit of a stored seq: err = %v, want Conflict", err)
	}
	if err := s.AppendAudit(ctx, in[1:], store.AuditHead{Seq: 2, Hash: "h2", MAC: "m2"}); errs.KindOf(err) != errs.InvalidArgument {
		t.Errorf("AppendAudit with a head that is not the last entry: err = %v, want InvalidArgument", err)
	}
	if err := s.AppendAudit(ctx, in[1:], store.AuditHead{Seq: 3, Hash: "h3", MAC: "m3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "auditsb"); err != nil {
		t.Fatal(err)
	}
	opts := cmp.Options{suiteOpts, cmpopts.IgnoreFields(store.AuditEntry{}, "DataRaw")}
	got, err := s.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, got, opts); d != "" {
		t.Errorf("ListAudit after the sandbox's deletion (-want +got):\n%s", d)
	}
	for _, tc := range []struct {
		name string
		f    store.AuditFilter
		want []store.AuditEntry
	}{
		{"after", store.AuditFilter{AfterSeq: 1}, in[1:]},
		{"since", store.AuditFilter{Since: suiteEpoch.Add(time.Second)}, in[1:]},
		{"sandbox", store.AuditFilter{SandboxID: "auditsb"}, in[:2]},
		{"owner", store.AuditFilter{Owner: "bob"}, in[2:]},
		{"limit", store.AuditFilter{Limit: 2}, in[:2]},
	} {
		got, err := s.ListAudit(ctx, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tc.want, got, opts); d != "" {
			t.Errorf("ListAudit %s (-want +got):\n%s", tc.name, d)
		}
	}
	head, err := s.AuditHead(ctx)
	if err != nil || head != (store.AuditHead{Seq: 3, Hash: "h3", MAC: "m3"}) {
		t.Errorf("AuditHead = %+v, %v; want seq 3 h3 m3", head, err)
	}
	last, err := s.AuditLast(ctx)
	if err != nil || last.Seq != 3 || last.Hash != "h3" {
		t.Errorf("AuditLast = %+v, %v; want seq 3", last, err)
	}
}

package kubestore

import (
	"testing"

	"github.com/berth-dev/berth/internal/store"
)

// A follower's ListEgress reads only the newest seq buckets: entries on
// both sides of a bucket boundary still all come back, in order.
func TestEgressAfterAcrossBuckets(t *testing.T) {
	p, ctx := openB(t), t.Context()
	if _, err := p.nextSeq(ctx, counterActivity, seqBucket-4); err != nil { // the next entries straddle the boundary
		t.Fatal(err)
	}
	var in []store.EgressEntry
	for range 10 {
		in = append(in, store.EgressEntry{SandboxID: "sb", Time: epochB, Proto: "tcp"})
	}
	if err := p.AppendEgress(ctx, in); err != nil {
		t.Fatal(err)
	}
	for _, after := range []int64{seqBucket - 3, seqBucket - 1, seqBucket, seqBucket + 5} {
		got, err := p.ListEgress(ctx, store.EgressFilter{AfterSeq: after})
		if err != nil {
			t.Fatal(err)
		}
		want := seqBucket + 6 - after
		if int64(len(got)) != want {
			t.Fatalf("after %d: %d entries, want %d", after, len(got), want)
		}
		for i, e := range got {
			if e.Seq != after+1+int64(i) {
				t.Fatalf("after %d: entry %d has seq %d", after, i, e.Seq)
			}
		}
	}
	if got, err := p.ListEgress(ctx, store.EgressFilter{AfterSeq: seqBucket + 6}); err != nil || len(got) != 0 {
		t.Errorf("after the last: %v, %v", got, err)
	}
}

// A timeline write that saw its sandbox before a concurrent delete and
// lands after the delete's cascade is removed by its own re-check: no row
// outlives its sandbox.
func TestActivityLateWriteDropped(t *testing.T) {
	p, ctx := openB(t), t.Context()
	mkSandbox(t, p, "gone", "kept")
	if err := p.DeleteSandbox(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	rows := []activityRow{{Seq: 1, SandboxID: "gone", Time: epochB, Kind: "exec"}, {Seq: 2, SandboxID: "kept", Time: epochB, Kind: "exec"}}
	// known: the check before the write found both (the delete came after).
	if err := p.writeActivity(ctx, rows, map[string]bool{"gone": true, "kept": true}); err != nil {
		t.Fatal(err)
	}
	if got, err := p.ListActivity(ctx, store.ActivityFilter{SandboxID: "gone"}); err != nil || len(got) != 0 {
		t.Errorf("activity of the deleted sandbox = %+v, %v; want none", got, err)
	}
	if got, err := p.ListActivity(ctx, store.ActivityFilter{SandboxID: "kept"}); err != nil || len(got) != 1 {
		t.Errorf("activity of the other = %+v, %v; want its entry", got, err)
	}
}

func TestAfterSel(t *testing.T) {
	for _, tc := range []struct {
		after, last int64
		want        string
	}{
		{0, 5000, "t"},
		{1, 5, "t,berth.dev/seqk in (0)"},
		{1023, 1024, "t,berth.dev/seqk in (0,1)"},
		{2048, 4100, "t,berth.dev/seqk in (2,3,4)"},
		{1, 64 * seqBucket, "t"},
	} {
		if got := afterSel("t", tc.after, tc.last); got != tc.want {
			t.Errorf("afterSel(%d, %d) = %q, want %q", tc.after, tc.last, got, tc.want)
		}
	}
}

package kubestore

// kstore-b's half of the conformance run, against a real kube-apiserver.
// kstore-a: remove when kubestore_test.go's TestKubeStore runs every
// subtest on the whole Store (its TestMain then replaces this one).

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

var srv *kubetest.Server

func TestMain(m *testing.M) { kubetest.Main(m, func(s *kubetest.Server) { srv = s }) }

// partialB is a Store whose methods of metering.go and ledgers*.go win by
// depth; restB (nil) stands for kstore-a's, except the few sandbox methods
// the subtests need, written below as a bare stand-in.
type partialB struct {
	*Store
	restB
}

type restB struct{ store.Store }

// The subtests of kstore-b.
var subtestsB = map[string]bool{"EgressLog": true, "Usage": true, "Quotas": true, "Activity": true, "UsageHours": true,
	"TemplateBuilds": true, "Tasks": true, "Notes": true, "Audit": true, "Effects": true, "EffectBatch": true, "Leases": true}

func TestKubeStoreB(t *testing.T) {
	start := time.Now()
	store.TestStore(t, func(t *testing.T) store.Store {
		name := t.Name()[strings.LastIndex(t.Name(), "/")+1:]
		if !subtestsB[name] {
			t.Skip("kstore-a's subtest")
		}
		s, err := Open(t.Context(), srv.Client, srv.Namespace(t))
		if err != nil {
			t.Fatal(err)
		}
		return partialB{Store: s}
	})
	t.Logf("kstore-b subtests: %v", time.Since(start))
}

// openB is a fresh store for ledgers_test.go (at the merge: kstore-a's
// Store in a fresh namespace).
func openB(t *testing.T) storeB {
	t.Helper()
	s, err := Open(t.Context(), srv.Client, srv.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	return partialB{Store: s}
}

// The stand-in sandbox: a bare Sandbox object (name = id, owner label)
// with the sandbox's JSON in an annotation.
const (
	sbAnnotation        = "test.berth.dev/sandbox"
	sbVersionAnnotation = "test.berth.dev/version" // sandbox.Sandbox.Version is not in its JSON
)

func (p partialB) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	sb.Version = 1
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = time.Now()
	}
	b, _ := json.Marshal(sb)
	obj := &berthv1.Sandbox{TypeMeta: kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Sandbox"},
		ObjectMeta: kube.ObjectMeta{Name: sb.ID, Namespace: p.ns, Labels: map[string]string{berthv1.LabelOwner: LabelValue(sb.Owner)},
			Annotations: map[string]string{sbAnnotation: string(b), sbVersionAnnotation: "1"}}}
	return p.kc.Create(ctx, berthv1.Sandboxes, p.ns, obj, nil)
}

func (p partialB) getSandbox(ctx context.Context, id string) (*berthv1.Sandbox, *sandbox.Sandbox, error) {
	var obj berthv1.Sandbox
	if err := p.kc.Get(ctx, berthv1.Sandboxes, p.ns, id, &obj); err != nil {
		return nil, nil, err
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(obj.Annotations[sbAnnotation]), &sb); err != nil {
		return nil, nil, err
	}
	sb.Version, _ = strconv.ParseInt(obj.Annotations[sbVersionAnnotation], 10, 64)
	return &obj, &sb, nil
}

func (p partialB) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	_, sb, err := p.getSandbox(ctx, id)
	return sb, err
}

func (p partialB) UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	for {
		obj, sb, err := p.getSandbox(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := fn(sb); err != nil {
			return nil, err
		}
		sb.Version++
		b, _ := json.Marshal(sb)
		obj.Annotations[sbAnnotation] = string(b)
		obj.Annotations[sbVersionAnnotation] = strconv.FormatInt(sb.Version, 10)
		err = p.kc.Update(ctx, berthv1.Sandboxes, p.ns, id, obj, nil)
		if errs.Is(err, errs.Conflict) {
			continue
		}
		return sb, err
	}
}

// DeleteSandbox deletes the object, then the rows that go with it (the
// order kstore-a's must keep: see deleteSandboxRowsB).
func (p partialB) DeleteSandbox(ctx context.Context, id string) error {
	if err := p.kc.Delete(ctx, berthv1.Sandboxes, p.ns, id, kube.DeleteOptions{}); err != nil {
		return err
	}
	return p.deleteSandboxRowsB(ctx, id)
}

func (p partialB) Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	var from sandbox.State
	sb, err := p.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) error {
		from = sb.State
		if err := sandbox.Transition(from, to); err != nil {
			return err
		}
		if fn != nil {
			if err := fn(sb); err != nil {
				return err
			}
		}
		sb.State = to
		return nil
	})
	if err != nil {
		return nil, err
	}
	ev.SandboxID, ev.Owner, ev.From, ev.To = sb.ID, sb.Owner, from, to
	if ev.Type == "" {
		ev.Type = "transition"
	}
	if ev.Seq, err = p.nextSeq(ctx, "events", 1); err != nil {
		return nil, err
	}
	return sb, p.eventActivityB(ctx, ev, sb)
}

// AppendEvent stores nothing of the event here (kstore-a's does): it
// numbers it and adds its timeline entry, which is what these subtests read.
func (p partialB) AppendEvent(ctx context.Context, ev sandbox.Event) (int64, error) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	seq, err := p.nextSeq(ctx, "events", 1)
	if err != nil {
		return 0, err
	}
	ev.Seq = seq
	return seq, p.eventActivityB(ctx, ev, nil)
}

func (p partialB) ApplyLeases(ctx context.Context, sandboxID string, set []store.LeaseUpdate, issue []store.Lease, sb func(*sandbox.Sandbox) bool) error {
	return p.applyLeases(ctx, sandboxID, set, issue, sb, p.UpdateSandbox)
}

package node

import (
	"context"
	"sync"

	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// LocalStore is the node daemon's own store (its SQLite journal), seen by
// the agent: every write of a sandbox row wakes the agent so the object
// follows at once (a replica reading right after a pause sees paused),
// and every row removal is remembered until the agent has mirrored it (a
// delete removes the row right after its deleted state, often before the
// agent's next pass could read that state). Wrap the store before the
// daemon is built: `berth node` passes the daemon NewLocalStore(st).
type LocalStore struct {
	store.Store

	wake chan struct{}

	mu      sync.Mutex
	removed map[string]bool
}

// NewLocalStore wraps st.
func NewLocalStore(st store.Store) *LocalStore {
	return &LocalStore{Store: st, wake: make(chan struct{}, 1), removed: map[string]bool{}}
}

// Changed receives after a sandbox row was written or removed.
func (s *LocalStore) Changed() <-chan struct{} { return s.wake }

func (s *LocalStore) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *LocalStore) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox) error {
	err := s.Store.CreateSandbox(ctx, sb)
	if err == nil {
		s.mu.Lock()
		delete(s.removed, sb.ID) // an id used again is not removed any more
		s.mu.Unlock()
		s.poke()
	}
	return err
}

func (s *LocalStore) UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	sb, err := s.Store.UpdateSandbox(ctx, id, fn)
	if err == nil {
		s.poke()
	}
	return sb, err
}

func (s *LocalStore) Transition(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	sb, err := s.Store.Transition(ctx, id, to, ev, fn)
	if err == nil {
		s.poke()
	}
	return sb, err
}

func (s *LocalStore) TransitionLeases(ctx context.Context, id string, to sandbox.State, ev sandbox.Event, fn func(*sandbox.Sandbox) error, ch store.LeaseChange) (*sandbox.Sandbox, error) {
	sb, err := s.Store.TransitionLeases(ctx, id, to, ev, fn, ch)
	if err == nil {
		s.poke()
	}
	return sb, err
}

func (s *LocalStore) ApplyLeases(ctx context.Context, sandboxID string, set []store.LeaseUpdate, issue []store.Lease, fn func(*sandbox.Sandbox) bool) error {
	err := s.Store.ApplyLeases(ctx, sandboxID, set, issue, fn)
	if err == nil && fn != nil {
		s.poke()
	}
	return err
}

func (s *LocalStore) DeleteSandbox(ctx context.Context, id string) error {
	err := s.Store.DeleteSandbox(ctx, id)
	if err == nil {
		s.mu.Lock()
		s.removed[id] = true
		s.mu.Unlock()
		s.poke()
	}
	return err
}

// Removed is a copy of the ids removed and not yet forgotten.
func (s *LocalStore) Removed() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.removed))
	for id := range s.removed {
		out[id] = true
	}
	return out
}

// Forget drops id from Removed (its object is gone).
func (s *LocalStore) Forget(id string) {
	s.mu.Lock()
	delete(s.removed, id)
	s.mu.Unlock()
}

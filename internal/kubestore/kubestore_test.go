package kubestore

import (
	"testing"

	"github.com/berth-dev/berth/internal/kube/kubetest"
	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/store/storetest"
)

var srv *kubetest.Server

func TestMain(m *testing.M) {
	kubetest.Main(m, func(s *kubetest.Server) { srv = s })
}

var _ store.Store = (*Store)(nil)

func openStore(t *testing.T) store.Store {
	t.Helper()
	s, err := Open(t.Context(), srv.Client, srv.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestKubeStore(t *testing.T) {
	storetest.TestStore(t, openStore)
}

// openB is a fresh whole store for ledgers_test.go.
func openB(t *testing.T) storeB {
	t.Helper()
	s, err := Open(t.Context(), srv.Client, srv.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

package store_test

import (
	"testing"

	"github.com/berth-dev/berth/internal/store"
	"github.com/berth-dev/berth/internal/store/storetest"
)

// TestSQLite runs the conformance suite (storetest) on SQLite; it is an
// external test because storetest imports store.
func TestSQLite(t *testing.T) {
	storetest.TestStore(t, func(t *testing.T) store.Store { return store.OpenTemp(t) })
}

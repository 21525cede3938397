package network

import "context"

// seedLoad loads the whole ruleset of m's state (m.mu held): the benchmarks'
// seeding, in a file of its own so that bench_linux_test.go also runs
// unchanged on the tree before the deltas (issue 14), for comparison.
func seedLoad(m *Manager) error { return m.loadLocked(context.Background(), true) }

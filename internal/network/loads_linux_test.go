package network

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/egress"
)

// Concurrent attaches and detaches share ruleset loads (loads.go), and each
// returns only once the loaded ruleset renders its own change: every
// attached sandbox's address is in the kernel's ruleset when its Attach
// returns, and none of a detached one's after its Detach.
func TestConcurrentAttachDetachLoads(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ruleset := func() string { return sh(t, "nft", "list", "table", "inet", e.mgr.cfg.Table) }
	const n = 12
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("grp%02dsandbox", i)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2*n)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			att, err := e.mgr.Attach(ctx, id, egress.Policy{Mode: egress.DenyAll})
			if err != nil {
				errc <- err
				return
			}
			if rs := ruleset(); !strings.Contains(rs, att.IP.String()) {
				errc <- fmt.Errorf("%s: Attach returned before the ruleset had %s", id, att.IP)
			}
		}()
	}
	wg.Wait()
	ips := map[string]string{}
	for _, id := range ids {
		att, ok := e.mgr.Get(id)
		if !ok {
			t.Fatalf("%s not attached", id)
		}
		ips[id] = att.IP.String()
	}
	for _, id := range ids[:n/2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.mgr.Detach(ctx, id); err != nil {
				errc <- err
				return
			}
			if rs := ruleset(); strings.Contains(rs, ips[id]+" ") || strings.Contains(rs, ips[id]+"\n") {
				errc <- fmt.Errorf("%s: Detach returned with %s still in the ruleset", id, ips[id])
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	rs := ruleset()
	for _, id := range ids[n/2:] {
		if !strings.Contains(rs, ips[id]) {
			t.Errorf("%s's address %s missing from the final ruleset", id, ips[id])
		}
	}
	for _, id := range ids[n/2:] {
		must(t, e.mgr.Detach(ctx, id))
	}
}

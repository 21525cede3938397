package egress

import (
	"context"
	"net"
)

// InterceptForTest runs the interception path for registered sandbox id
// on an accepted client connection and a dialled upstream (benchmarks in
// package egress_test, which can link internal/effects).
func (p *Proxy) InterceptForTest(ctx context.Context, id, host string, port uint16, client, up net.Conn) error {
	p.mu.Lock()
	st := p.byID[id]
	p.mu.Unlock()
	_, _, err := p.intercept(ctx, st, host, port, client, up)
	return err
}

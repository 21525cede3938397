package egress

// InFlight is the number of proxied connections of sandbox id open right
// now (the reaper counts a sandbox waiting on a long upstream call as busy).
func (p *Proxy) InFlight(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.byID[id]; st != nil {
		return len(st.conns)
	}
	return 0
}

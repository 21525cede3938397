package network

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/berth-dev/berth/internal/errs"
)

// Layout names the host objects a Manager owns: what must be the same at
// the next start for the sandboxes that outlive the daemon to fit.
type Layout struct {
	Bridge     string       `json:"bridge"`
	Subnet     netip.Prefix `json:"subnet"`
	Table      string       `json:"table"`
	VethPrefix string       `json:"veth_prefix"`
}

const layoutFile = "layout.json"

// SavedLayout returns the layout the last Setup over stateDir used, so a
// restarted server can take it over instead of deriving a new one (a
// derived subnet must not move because the server's own bridge, kept alive
// by running sandboxes, now occupies it).
func SavedLayout(stateDir string) (Layout, bool, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, layoutFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Layout{}, false, nil
	}
	if err != nil {
		return Layout{}, false, errs.Wrap(errs.Internal, err, "read network layout")
	}
	var l Layout
	if err := json.Unmarshal(b, &l); err != nil || !l.Subnet.IsValid() || l.Bridge == "" || l.Table == "" || l.VethPrefix == "" {
		return Layout{}, false, errs.E(errs.FailedPrecondition, "network layout %s is damaged: %v", filepath.Join(stateDir, layoutFile), err)
	}
	return l, true, nil
}

func (m *Manager) layout() Layout {
	return Layout{Bridge: m.cfg.BridgeName, Subnet: m.cfg.Subnet, Table: m.cfg.Table, VethPrefix: m.cfg.VethPrefix}
}

func (m *Manager) saveLayout() error {
	b, err := json.MarshalIndent(m.layout(), "", "  ")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "encode network layout")
	}
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return errs.Wrap(errs.Internal, err, "create state dir")
	}
	p := filepath.Join(m.cfg.StateDir, layoutFile)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return errs.Wrap(errs.Internal, err, "write network layout")
	}
	return errs.Wrap(errs.Internal, os.Rename(p+".tmp", p), "write network layout")
}

// fitsLocked reports whether a persisted attachment can stay as it is under
// the current layout: its address is a host address of the subnet, its
// veth carries the prefix and hangs on the bridge. links maps host link
// names to their master.
func (m *Manager) fitsLocked(id string, r *record, links map[string]string, taken map[netip.Addr]string) bool {
	s := m.cfg.Subnet
	ok := s.Contains(r.IP) && r.IP != s.Addr() && r.IP != m.cfg.Gateway() && r.IP != lastAddr(s) &&
		len(r.Veth) > len(m.cfg.VethPrefix) && r.Veth[:len(m.cfg.VethPrefix)] == m.cfg.VethPrefix &&
		links[r.Veth] == m.cfg.BridgeName
	if other, dup := taken[r.IP]; ok && dup && other != id {
		return false
	}
	return ok
}

// reattachLocked gives a persisted sandbox whose attachment does not fit
// the layout (the subnet, prefix or bridge changed, or its veth is gone) a
// new veth and address inside the namespace it already runs in. Its
// processes keep running; open connections break. A sandbox whose
// namespace is gone cannot be reattached: it is dropped and the reason kept
// for Lost.
func (m *Manager) reattachLocked(ctx context.Context, id string, r *record) error {
	nsPath := m.netnsPath(id)
	if _, err := os.Stat(nsPath); err != nil {
		return errs.Wrap(errs.FailedPrecondition, err, "network namespace of %s is gone", id)
	}
	// Deleting the host end removes eth0 inside too; a leftover eth0 (host
	// end renamed or moved by hand) goes explicitly.
	if err := deleteLink(ctx, r.Veth); err != nil {
		return err
	}
	_ = deleteLinkIn(nsPath, "eth0")
	r.IP = netip.Addr{}
	ip, err := m.allocLocked(id)
	if err != nil {
		return err
	}
	veth := m.vethName(id)
	if err := createVeth(ctx, veth, nsPath, m.cfg.BridgeName); err != nil {
		return err
	}
	if err := configureInside(ctx, nsPath, netip.PrefixFrom(ip, m.cfg.Subnet.Bits()), m.cfg.Gateway()); err != nil {
		_ = deleteLink(ctx, veth)
		return err
	}
	r.IP, r.Veth = ip, veth
	return nil
}

// reconcileLayoutLocked reattaches every persisted sandbox that does not
// fit the layout (see fitsLocked); one that cannot be reattached is dropped
// from the plan, never a reason to refuse to start.
func (m *Manager) reconcileLayoutLocked(ctx context.Context) error {
	links, err := linkMasters(ctx)
	if err != nil {
		return err
	}
	taken := map[netip.Addr]string{}
	for id, r := range m.sbs {
		if _, dup := taken[r.IP]; !dup {
			taken[r.IP] = id
		}
	}
	var misfits []string
	for id, r := range m.sbs {
		if !validChainID(id) || r.Policy.Validate() != nil {
			// A record the ruleset cannot name or enforce (a damaged state
			// file): dropped, so it cannot keep the server from starting.
			m.log.Error("network: dropping an unusable attachment record", "sandbox_id", id)
			delete(m.sbs, id)
			m.lost[id] = "its network record was unusable"
			continue
		}
		if !m.fitsLocked(id, r, links, taken) {
			misfits = append(misfits, id)
		}
	}
	if len(misfits) == 0 && len(m.lost) == 0 {
		return nil
	}
	for _, id := range misfits {
		r := m.sbs[id]
		old := r.IP
		if err := m.reattachLocked(ctx, id, r); err != nil {
			m.log.Error("network: cannot reattach sandbox to the current layout; it has no network until restarted",
				"sandbox_id", id, "err", err)
			delete(m.sbs, id)
			_ = deleteLink(ctx, r.Veth)
			m.lost[id] = err.Error()
			continue
		}
		m.log.Warn("network: sandbox reattached to the current layout", "sandbox_id", id, "old_ip", old.String(), "ip", r.IP.String())
		m.moved[id] = old.String() + " → " + r.IP.String()
	}
	return m.saveLocked()
}

// dropPrevLayout removes the bridge and tables of the layout this state dir
// used before, when they are not the current ones: every attachment has
// moved off them (reconcileLayoutLocked). Best effort: a leftover only
// costs a link or an empty table.
func (m *Manager) dropPrevLayout(ctx context.Context, prev Layout) {
	if prev.Table != m.cfg.Table && validIfName(prev.Table) {
		if err := nftApply(ctx, PlanDelete(prev.Table)); err != nil {
			m.log.Warn("network: removing the previous layout's tables", "table", prev.Table, "err", err)
		}
	}
	if prev.Bridge != m.cfg.BridgeName && validIfName(prev.Bridge) {
		if err := deleteLink(ctx, prev.Bridge); err != nil {
			m.log.Warn("network: removing the previous layout's bridge", "bridge", prev.Bridge, "err", err)
		}
	}
}

// Reattached returns, per sandbox id, what Setup did to attachments that
// did not fit the layout: moved ("old → new" address) or lost (why it
// could not be reattached and now has no network).
func (m *Manager) Reattached() (moved, lost map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	moved, lost = map[string]string{}, map[string]string{}
	for k, v := range m.moved {
		moved[k] = v
	}
	for k, v := range m.lost {
		lost[k] = v
	}
	return moved, lost
}

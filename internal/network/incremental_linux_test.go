package network

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/testutil"
)

// rulesetOf returns the kernel's berth tables as a sorted list of objects
// (nft -j), without what differs between equal rulesets loaded another way:
// handles and the order of map and set elements. A rule keeps its chain
// and its position in the chain.
func rulesetOf(t testing.TB, table string) []string {
	t.Helper()
	var out []string
	for _, family := range []string{"bridge", "inet"} {
		raw := sh(t, "nft", "-j", "list", "table", family, table)
		var doc struct {
			Nftables []map[string]any `json:"nftables"`
		}
		if err := json.Unmarshal([]byte(raw), &doc); err != nil {
			t.Fatalf("nft -j: %v\n%s", err, raw)
		}
		pos := map[string]int{}
		for _, obj := range doc.Nftables {
			for kind, v := range obj {
				if kind == "metainfo" {
					continue
				}
				o, _ := v.(map[string]any)
				delete(o, "handle")
				if elems, ok := o["elem"].([]any); ok {
					sort.Slice(elems, func(i, j int) bool { return jsonString(elems[i]) < jsonString(elems[j]) })
				}
				if kind == "rule" {
					c := fmt.Sprint(o["chain"])
					o["position"] = pos[c]
					pos[c]++
				}
				out = append(out, kind+" "+jsonString(o))
			}
		}
	}
	sort.Strings(out)
	return out
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// fullReload loads the whole ruleset (Plan) of the manager's current state,
// as Setup does after a crash.
func fullReload(t testing.TB, m *Manager) {
	t.Helper()
	m.mu.Lock()
	err := m.loadLocked(context.Background(), true)
	m.mu.Unlock()
	must(t, err)
}

// checkMatchesPlan asserts that the ruleset the deltas built is the one the
// full plan of the same sandboxes builds: as nft lists it, and the kernel's
// bytecode of every sandbox chain (nft's listing hides the dependencies it
// would have added itself, such as meta nfproto ipv4).
func checkMatchesPlan(t *testing.T, m *Manager, when string) {
	t.Helper()
	incremental, incrementalCode := rulesetOf(t, m.cfg.Table), sandboxBytecode(t, m.cfg.Table)
	fullReload(t, m)
	if diff := cmp.Diff(rulesetOf(t, m.cfg.Table), incremental); diff != "" {
		t.Fatalf("%s: the incremental ruleset differs from the full plan's (-full +incremental)\n%s", when, diff)
	}
	if diff := cmp.Diff(sandboxBytecode(t, m.cfg.Table), incrementalCode); diff != "" {
		t.Fatalf("%s: the incremental bytecode differs from the full plan's (-full +incremental)\n%s", when, diff)
	}
}

// sandboxBytecode is the kernel's expressions of every sandbox chain
// (port_, pre_, fwd_) of table, one string per rule. A dump that another
// process's ruleset change interrupts may come back short without an error
// (other jobs on this host load rulesets of their own), so it is read until
// two reads agree.
func sandboxBytecode(t testing.TB, table string) map[string][]string {
	t.Helper()
	prev := readBytecode(t, table)
	for range 10 {
		cur := readBytecode(t, table)
		if cmp.Equal(prev, cur) {
			return cur
		}
		prev = cur
	}
	t.Fatalf("the rules of %s kept changing between reads", table)
	return nil
}

func readBytecode(t testing.TB, table string) map[string][]string {
	t.Helper()
	c, err := nftables.New()
	must(t, err)
	out := map[string][]string{}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		chains, err := c.ListChainsOfTableFamily(fam)
		must(t, err)
		for _, ch := range chains {
			if ch.Table.Name != table || ch.Hooknum != nil {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			must(t, err)
			var rs []string
			for _, r := range rules {
				var b strings.Builder
				for _, e := range r.Exprs {
					fmt.Fprintf(&b, "%T%+v ", e, e)
				}
				rs = append(rs, b.String())
			}
			out[fmt.Sprintf("%d/%s", fam, ch.Name)] = rs
		}
	}
	if len(out) == 0 {
		t.Logf("no sandbox chains in %s", table)
	}
	return out
}

// Many attach/detach/update cycles of a few sandboxes, some concurrent (so
// deltas are group-committed), leave exactly the ruleset the full plan
// renders for the sandboxes attached at the end; and the rules of two
// sandboxes attached side by side still judge real packets apart.
func TestIncrementalMatchesPlan(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	policies := []egress.Policy{
		{Mode: egress.DenyAll},
		{Mode: egress.AllowAll},
		policy(t, "allow-all", nil, []string{goodIP, "198.51.100.0/24:53"}),
		policy(t, "rules", []string{goodIP, "good.test", "198.51.100.7:123"}, []string{"203.0.113.0/28"}),
		policy(t, "rules", []string{otherIP + ":7"}, nil),
	}
	ids := []string{"inc0", "inc1", "inc2", "inc3", "inc4", "inc5"}
	rng := rand.New(rand.NewPCG(14, 14))
	attached := map[string]bool{}
	for step := 0; step < 60; step++ {
		if step%10 == 5 {
			// A burst: every detached sandbox attaches at once.
			var wg sync.WaitGroup
			for _, id := range ids {
				if attached[id] {
					continue
				}
				attached[id] = true
				pol := policies[rng.IntN(len(policies))]
				wg.Go(func() {
					if _, err := e.mgr.Attach(ctx, id, pol); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			continue
		}
		id := ids[rng.IntN(len(ids))]
		switch {
		case !attached[id]:
			_, err := e.mgr.Attach(ctx, id, policies[rng.IntN(len(policies))])
			must(t, err)
			attached[id] = true
		case rng.IntN(2) == 0:
			must(t, e.mgr.Detach(ctx, id))
			attached[id] = false
		default:
			must(t, e.mgr.UpdatePolicy(ctx, id, policies[rng.IntN(len(policies))]))
		}
		if step%10 == 9 {
			checkMatchesPlan(t, e.mgr, fmt.Sprintf("step %d", step))
		}
	}
	for _, id := range ids {
		if attached[id] {
			must(t, e.mgr.Detach(ctx, id))
		}
	}
	if got := rulesetOf(t, e.mgr.cfg.Table); len(got) == 0 {
		t.Fatal("no ruleset listed")
	}
	checkMatchesPlan(t, e.mgr, "all detached")

	// Real packets after the cycles: UDP (forwarded, judged by the
	// sandbox's own fwd chain) to an echo server on the "internet".
	echo := map[string]string{goodIP: udpEcho(t, e.inetNS, goodIP), otherIP: udpEcho(t, e.inetNS, otherIP)}
	a := e.attach("sepa", policy(t, "rules", []string{goodIP}, nil))
	b := e.attach("sepb", policy(t, "allow-all", nil, []string{goodIP}))
	c := e.attach("sepc", egress.Policy{Mode: egress.DenyAll})
	for _, tc := range []struct {
		id, to string
		want   bool
	}{
		{"sepa", goodIP, true}, {"sepa", otherIP, false},
		{"sepb", goodIP, false}, {"sepb", otherIP, true},
		{"sepc", goodIP, false}, {"sepc", otherIP, false},
	} {
		if got := udpRoundTrip(t, e.mgr.netnsPath(tc.id), tc.to+":"+echo[tc.to]); got != tc.want {
			t.Errorf("%s → %s UDP answered=%v, want %v", tc.id, tc.to, got, tc.want)
		}
	}
	// One sandbox's update changes its rules only.
	must(t, e.mgr.UpdatePolicy(ctx, "sepa", egress.Policy{Mode: egress.DenyAll}))
	if udpRoundTrip(t, a.NetNSPath, goodIP+":"+echo[goodIP]) {
		t.Error("sepa still reaches good after its update to deny-all")
	}
	if !udpRoundTrip(t, b.NetNSPath, otherIP+":"+echo[otherIP]) {
		t.Error("sepb lost other after sepa's update")
	}
	// Sandboxes never reach each other, whatever their policies.
	if udpRoundTripTo(t, b.NetNSPath, c.NetNSPath, c.IP.String()) {
		t.Error("sepb reached sepc over UDP")
	}
	checkMatchesPlan(t, e.mgr, "separation")
}

// A delta that meets a ruleset which drifted from the state (a map element
// or a whole table removed behind berth's back) fails as a whole; the load
// is retried as the full plan, and the change succeeds.
func TestDeltaFailureLoadsTheWholeRuleset(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.mgr.cfg.Table
	a := e.attach("drift1", egress.Policy{Mode: egress.AllowAll})
	e.attach("drift2", egress.Policy{Mode: egress.DenyAll})

	sh(t, "nft", "delete", "element", "inet", tbl, "fwd4", "{", a.IP.String(), "}")
	must(t, e.mgr.Detach(ctx, "drift1")) // its delete element fails
	checkMatchesPlan(t, e.mgr, "detach over a missing element")

	sh(t, "nft", "delete", "table", "inet", tbl)
	e.attach("drift3", policy(t, "rules", []string{goodIP}, nil)) // no table to add to
	checkMatchesPlan(t, e.mgr, "attach over a missing table")
	if !strings.Contains(strings.Join(rulesetOf(t, tbl), "\n"), "fwd_drift2") {
		t.Error("the full reload lost drift2")
	}
}

// When neither the delta nor the whole ruleset can be loaded, Attach fails with the
// reason and leaves nothing of the sandbox behind; the next change loads
// the whole ruleset.
func TestFailedLoadLeavesTheSandboxDetached(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.attach("keep1", egress.Policy{Mode: egress.DenyAll})
	// The delta has no table to go to, and the whole ruleset no nft.
	sh(t, "nft", "delete", "table", "inet", e.mgr.cfg.Table)
	t.Setenv("PATH", t.TempDir())
	_, err := e.mgr.Attach(ctx, "fail1", egress.Policy{Mode: egress.AllowAll})
	if !errs.Is(err, errs.FailedPrecondition) || !strings.Contains(err.Error(), "nft") {
		t.Fatalf("Attach without nft = %v, want FailedPrecondition naming nft", err)
	}
	if _, ok := e.mgr.Get("fail1"); ok {
		t.Error("fail1 still attached")
	}
	assertGone(t, e.mgr.netnsPath("fail1"), e.mgr.vethName("fail1"))
	t.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	e.attach("next1", egress.Policy{Mode: egress.DenyAll})
	rs := strings.Join(rulesetOf(t, e.mgr.cfg.Table), "\n")
	if strings.Contains(rs, "fail1") || !strings.Contains(rs, "fwd_next1") || !strings.Contains(rs, "fwd_keep1") {
		t.Errorf("ruleset after recovery:\n%s", rs)
	}
	checkMatchesPlan(t, e.mgr, "after recovery")
}

// udpEcho serves UDP echo on ip and a free port in the namespace at nsPath
// (bound to the address, so that the answer comes from it).
func udpEcho(t *testing.T, nsPath, ip string) string {
	t.Helper()
	var pc net.PacketConn
	must(t, testutil.InNetns(nsPath, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(ip, "0"))
		return err
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	return port
}

// udpRoundTrip sends a datagram from the namespace at nsPath to addr and
// reports whether the echo came back (a few tries, each within 300 ms).
func udpRoundTrip(t *testing.T, nsPath, addr string) bool {
	t.Helper()
	var c net.Conn
	must(t, testutil.InNetns(nsPath, func() error {
		var err error
		c, err = net.Dial("udp4", addr)
		return err
	}))
	defer c.Close()
	buf := make([]byte, 64)
	for range 3 {
		if _, err := c.Write([]byte("berth")); err != nil {
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(buf); err == nil && string(buf[:n]) == "berth" {
			return true
		}
	}
	return false
}

// udpRoundTripTo runs an echo server in the namespace at dstNS and sends it
// a datagram from srcNS.
func udpRoundTripTo(t *testing.T, srcNS, dstNS, dstIP string) bool {
	t.Helper()
	return udpRoundTrip(t, srcNS, dstIP+":"+udpEcho(t, dstNS, dstIP))
}

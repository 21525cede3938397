package agentapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// The agent channel's handshake authenticates both ends with a per-sandbox
// key that never crosses the wire: each side proves it holds the key by an
// HMAC over both fresh nonces and the sandbox id, under a label of its own
// (so one side's answer can never be reflected back as the other's).
//
//	agent  → daemon  hello:    magic(8) idLen(1) id nonceA(32)
//	daemon → agent   proof:    nonceD(32) HMAC(key, "daemon"‖id‖nonceA‖nonceD)(32)
//	agent  → daemon  proof:    HMAC(key, "agent"‖id‖nonceA‖nonceD)(32)
//	daemon → agent   accepted: 1 byte (0x01)
//
// Every frame has a fixed or one-byte-bounded size: nothing read before
// authentication can be large.
//
// A caller connection (caller.go: the in-sandbox API, where the agent is the
// HTTP client and the daemon the server) runs the same exchange with its own
// magic ("berthcl1") and its own proof labels ("caller-daemon", "caller"), so
// an uplink and a caller can never be confused nor one's proof replayed as
// the other's.

// KeySize is the size of a per-sandbox channel key.
const KeySize = 32

// MaxIDLen bounds the sandbox id in a hello.
const MaxIDLen = 64

// HandshakeTimeout bounds the whole handshake on both sides.
const HandshakeTimeout = 5 * time.Second

const (
	nonceSize = 32
	macSize   = sha256.Size
	accepted  = 0x01
)

var magic = [8]byte{'b', 'e', 'r', 't', 'h', 'c', 'h', '1'}

// DeriveKey is the channel key of sandbox id under the host's master key:
// nothing per sandbox needs storing, and one sandbox's key says nothing
// about another's.
func DeriveKey(master []byte, id string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("berth agent channel key v1\x00"))
	m.Write([]byte(id))
	return m.Sum(nil)
}

func proof(key []byte, label, id string, nonceA, nonceD []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write([]byte{0, byte(len(id))})
	m.Write([]byte(id))
	m.Write(nonceA)
	m.Write(nonceD)
	return m.Sum(nil)
}

func nonce() ([]byte, error) {
	b := make([]byte, nonceSize)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return b, nil
}

// AgentHandshake is the agent's side: it announces id, checks the daemon's
// proof before it says anything keyed, then proves itself.
func AgentHandshake(conn net.Conn, id string, key []byte) error {
	return dialHandshake(conn, KindAgent, id, key)
}

// dialHandshake is the dialing side of a connection of kind k.
func dialHandshake(conn net.Conn, k Kind, id string, key []byte) error {
	if len(id) == 0 || len(id) > MaxIDLen {
		return errs.Field("id", "must be 1..%d bytes", MaxIDLen)
	}
	if len(key) != KeySize {
		return errs.Field("key", "must be %d bytes", KeySize)
	}
	mg, dLabel, aLabel := k.labels()
	_ = conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	nA, err := nonce()
	if err != nil {
		return err
	}
	hello := make([]byte, 0, len(mg)+1+len(id)+nonceSize)
	hello = append(hello, mg[:]...)
	hello = append(hello, byte(len(id)))
	hello = append(hello, id...)
	hello = append(hello, nA...)
	if _, err := conn.Write(hello); err != nil {
		return fmt.Errorf("agent channel: send hello: %w", err)
	}
	var resp [nonceSize + macSize]byte
	if _, err := io.ReadFull(conn, resp[:]); err != nil {
		return fmt.Errorf("agent channel: read daemon proof: %w", err)
	}
	nD := resp[:nonceSize]
	if !hmac.Equal(resp[nonceSize:], proof(key, dLabel, id, nA, nD)) {
		return errs.E(errs.Unauthenticated, "agent channel: the peer is not this sandbox's daemon")
	}
	if _, err := conn.Write(proof(key, aLabel, id, nA, nD)); err != nil {
		return fmt.Errorf("agent channel: send proof: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil || ack[0] != accepted {
		return errs.E(errs.Unauthenticated, "agent channel: the daemon refused this agent")
	}
	return nil
}

// DaemonHandshake is the daemon's side for an uplink: keyFor returns the
// key of an id this channel accepts (false: refuse). It returns the agent's
// id; a caller's hello is refused.
func DaemonHandshake(conn net.Conn, keyFor func(id string) ([]byte, bool)) (string, error) {
	id, _, err := DaemonAccept(conn, func(k Kind, id string) ([]byte, bool) {
		if k != KindAgent {
			return nil, false
		}
		return keyFor(id)
	})
	return id, err
}

// DaemonAccept is the daemon's side of either kind of connection: the
// hello's magic says which, and keyFor returns the key of an (kind, id)
// this channel accepts (false: refuse). It returns the id and the kind.
func DaemonAccept(conn net.Conn, keyFor func(k Kind, id string) ([]byte, bool)) (string, Kind, error) {
	_ = conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	var head [len(magic) + 1]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return "", 0, fmt.Errorf("agent channel: read hello: %w", err)
	}
	var k Kind
	switch [8]byte(head[:8]) {
	case magic:
		k = KindAgent
	case callerMagic:
		k = KindCaller
	default:
		return "", 0, errs.E(errs.Unauthenticated, "agent channel: not a berth agent (bad magic)")
	}
	_, dLabel, aLabel := k.labels()
	n := int(head[8])
	if n == 0 || n > MaxIDLen {
		return "", 0, errs.E(errs.Unauthenticated, "agent channel: id length %d out of range", n)
	}
	rest := make([]byte, n+nonceSize)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return "", 0, fmt.Errorf("agent channel: read hello: %w", err)
	}
	id, nA := string(rest[:n]), rest[n:]
	key, ok := keyFor(k, id)
	if !ok || len(key) != KeySize {
		return "", 0, errs.E(errs.Unauthenticated, "agent channel: %s id %q is not accepted here", k, id)
	}
	nD, err := nonce()
	if err != nil {
		return "", 0, err
	}
	if _, err := conn.Write(append(append([]byte{}, nD...), proof(key, dLabel, id, nA, nD)...)); err != nil {
		return "", 0, fmt.Errorf("agent channel: send proof: %w", err)
	}
	var got [macSize]byte
	if _, err := io.ReadFull(conn, got[:]); err != nil {
		return "", 0, fmt.Errorf("agent channel: read %s proof: %w", k, err)
	}
	if !hmac.Equal(got[:], proof(key, aLabel, id, nA, nD)) {
		return "", 0, errs.E(errs.Unauthenticated, "agent channel: the %s's proof is wrong", k)
	}
	if _, err := conn.Write([]byte{accepted}); err != nil {
		return "", 0, fmt.Errorf("agent channel: send accept: %w", err)
	}
	return id, k, nil
}

package egress

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
)

// EffectPolicy says which requests of a sandbox are side effects that the
// side-effect ledger (internal/effects, docs/EFFECTS.md) records before
// they are sent, and what a repeat of a completed one gets. Requests with
// an injected secret are always recorded; Hosts adds the hosts whose
// non-GET/HEAD/OPTIONS requests are (those hosts are intercepted: TLS with
// berth's egress CA, plain HTTP request by request).
type EffectPolicy struct {
	Hosts []Rule `json:"hosts,omitempty"` // hostnames or "*.domain", optionally :PORT
	// Idempotency: "keep" (default) keeps the agent's Idempotency-Key and
	// adds none; "derive" adds one derived from (lineage, step, method,
	// host, path, body hash) where the agent set none.
	Idempotency string `json:"idempotency,omitempty"`
	// Repeat: "replay" (default) answers a repeat of a completed effect
	// from the ledger; "refuse" answers it 409.
	Repeat string `json:"repeat,omitempty"`
}

// Effect policy values.
const (
	IdempotencyKeep   = "keep"
	IdempotencyDerive = "derive"
	RepeatReplay      = "replay"
	RepeatRefuse      = "refuse"
)

// IsZero reports whether the policy says nothing (the JSON omits it).
func (e EffectPolicy) IsZero() bool {
	return len(e.Hosts) == 0 && e.Idempotency == "" && e.Repeat == ""
}

// ParseEffectPolicy builds an EffectPolicy from CLI/API strings; errors
// name the field.
func ParseEffectPolicy(hosts []string, idempotency, repeat string) (EffectPolicy, error) {
	e := EffectPolicy{Idempotency: idempotency, Repeat: repeat}
	for _, h := range hosts {
		r, err := ParseRule(h)
		if err != nil {
			return EffectPolicy{}, errs.Field("effectful", "%q: %v", h, errs.Short(err))
		}
		e.Hosts = append(e.Hosts, r)
	}
	return e, e.Validate()
}

// Validate checks the hosts and the two settings.
func (e EffectPolicy) Validate() error {
	for _, r := range e.Hosts {
		if r.Kind != RuleHost && r.Kind != RuleWildcard {
			return errs.Field("effectful", "%q: effectful hosts are hostnames or *.domain (an address has no name to intercept)", r.String())
		}
	}
	if len(e.Hosts) > 256 {
		return errs.Field("effectful", "at most 256 hosts, got %d", len(e.Hosts))
	}
	switch e.Idempotency {
	case "", IdempotencyKeep, IdempotencyDerive:
	default:
		return errs.Field("idempotency", "must be keep or derive, got %q", e.Idempotency)
	}
	switch e.Repeat {
	case "", RepeatReplay, RepeatRefuse:
	default:
		return errs.Field("repeat", "must be replay or refuse, got %q", e.Repeat)
	}
	return nil
}

// Effectful reports whether host:port is marked effectful.
func (e EffectPolicy) Effectful(host string, port uint16) bool {
	host = normalizeHost(host)
	for _, r := range e.Hosts {
		if r.matchesHost(host, port) {
			return true
		}
	}
	return false
}

// SafeMethod is a method without side effects by HTTP's definition.
func SafeMethod(m string) bool {
	switch strings.ToUpper(m) {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

// Bounds of what the proxy holds of one effect.
const (
	// MaxEffectBody is the largest request body an effect may carry: the
	// proxy reads it whole to hash it before anything is sent; a bigger
	// one is refused with 413 and not sent.
	MaxEffectBody = 8 << 20
	// MaxReplayBody is the largest response body kept for replay; an
	// effect with a bigger answer is recorded but cannot be replayed.
	MaxReplayBody = 64 << 10
	// MaxIdempotencyKey bounds the agent's Idempotency-Key.
	MaxIdempotencyKey = 255
)

// Intent is an effectful request as the proxy sees it before sending it.
type Intent struct {
	SandboxID  string
	Method     string
	Host       string // the decided host name
	Port       uint16
	Path       string // request target in origin form (path and query)
	BodySHA256 string // hex
	BodySize   int64
	Key        string // the agent's Idempotency-Key, "" if none
	Secret     bool   // the request carries an injected secret
	Policy     EffectPolicy
}

// Replay is a recorded answer.
type Replay struct {
	Status int
	Header http.Header
	Body   []byte
}

// Ticket is the ledger's answer to an intent: send it (Effect names the
// recorded intent, SetKey is an Idempotency-Key to add), or answer the
// sandbox without sending (Replay, or a refusal with Status and Message).
type Ticket struct {
	Effect  string
	SetKey  string
	Replay  *Replay
	Status  int // a refusal: HTTP status (409, 429, ...)
	Message string
}

// Outcome is what came back of a sent effect.
type Outcome struct {
	Status   int
	Header   http.Header
	Body     []byte // the whole body when Complete, else nil
	Complete bool   // Body holds the whole response body (≤ MaxReplayBody)
	Size     int64  // response body bytes relayed
	Err      error  // sending or reading failed: the outcome is unknown
	// NotSent: no byte of the request went upstream (the upstream's TLS
	// handshake failed after the intent was recorded): it never happened.
	NotSent  bool
	Duration time.Duration
}

// Ledger records side effects: the intent before the request is sent, the
// outcome after. internal/effects implements it. Begin must be durable
// before it returns a Ticket to send; an error means "not recorded" and
// the proxy then refuses the request (fail closed). Finish should not
// block on the store: it is called on the connection's path, after the
// answer was relayed.
type Ledger interface {
	Begin(ctx context.Context, in Intent) (Ticket, error)
	Finish(ctx context.Context, effect string, out Outcome)
}

// SetLedger installs the side-effect ledger (nil: none; effectful hosts are
// then relayed unrecorded).
func (p *Proxy) SetLedger(l Ledger) {
	p.mu.Lock()
	p.ledger = l
	p.mu.Unlock()
}

func (p *Proxy) ledgerOf() Ledger {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ledger
}

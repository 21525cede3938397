package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/store"
)

// Genesis is the prev_hash of the first entry.
var Genesis = strings.Repeat("0", 64)

// canonical is the encoding an entry's hash covers: a JSON object with
// these fields in this order, time in RFC 3339 with nanoseconds in UTC, and
// data's keys sorted (encoding/json sorts map keys). Every string is valid
// UTF-8 (clip makes it so before an entry is hashed), so decoding the
// stored row and encoding it again gives the same bytes.
type canonical struct {
	Seq     int64             `json:"seq"`
	Time    string            `json:"time"`
	Actor   string            `json:"actor"`
	Action  string            `json:"action"`
	Sandbox string            `json:"sandbox"`
	Owner   string            `json:"owner"`
	Data    map[string]string `json:"data"`
}

// Canonical is the byte string an entry's hash covers (after its
// predecessor's hash): docs/AUDIT.md gives the rule for outside verifiers.
func Canonical(e store.AuditEntry) []byte {
	d := e.Data
	if d == nil {
		d = map[string]string{}
	}
	b, _ := json.Marshal(canonical{Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano), Actor: e.Actor,
		Action: e.Action, Sandbox: e.SandboxID, Owner: e.Owner, Data: d})
	return b
}

// Hash is hex(SHA-256(prev ‖ Canonical(e))), prev being the predecessor's
// hash as its 32 bytes (Genesis for the first entry).
func Hash(prev string, e store.AuditEntry) string {
	h := sha256.New()
	p, err := hex.DecodeString(prev)
	if err != nil || len(p) != sha256.Size {
		// An undecodable prev_hash is hashed as its text: the result
		// cannot match a hash the writer made, so verify reports it.
		p = []byte(prev)
	}
	h.Write(p)
	h.Write(Canonical(e))
	return hex.EncodeToString(h.Sum(nil))
}

// MAC is the audit key's HMAC-SHA-256 over (seq, hash): what a database
// edit alone cannot recompute.
func MAC(key []byte, seq int64, hash string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("berth audit v1\n"))
	m.Write([]byte(strconv.FormatInt(seq, 10)))
	m.Write([]byte{'\n'})
	m.Write([]byte(hash))
	return hex.EncodeToString(m.Sum(nil))
}

func macOK(key []byte, seq int64, hash, mac string) bool {
	want := MAC(key, seq, hash)
	return hmac.Equal([]byte(want), []byte(mac))
}

// Bounds of an entry: what a sandbox or a client sends ends up in data
// (argv, paths, hosts), so each part is clipped.
const (
	MaxKeys     = 32
	MaxKey      = 64
	MaxValue    = 1024
	MaxData     = 8 << 10 // keys and values of one entry together
	MaxField    = 256     // actor, action, sandbox, owner
	clippedMark = "…"
)

// clip bounds s to max bytes of valid UTF-8 (invalid sequences become
// U+FFFD first, so the stored JSON decodes to the hashed string).
func clip(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	cut := max - len(clippedMark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + clippedMark
}

// bound returns a bounded copy of data: at most MaxKeys keys (the first in
// sorted order), each clipped, and MaxData bytes in all; a "clipped" key
// says how many keys were left out.
func bound(data map[string]string) map[string]string {
	if len(data) == 0 {
		return map[string]string{}
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]string, min(len(keys), MaxKeys))
	size, left := 0, 0
	for _, k := range keys {
		ck, cv := clip(k, MaxKey), clip(data[k], MaxValue)
		if len(out) >= MaxKeys-1 || size+len(ck)+len(cv) > MaxData {
			left++
			continue
		}
		if _, dup := out[ck]; dup {
			left++
			continue
		}
		out[ck] = cv
		size += len(ck) + len(cv)
	}
	if left > 0 {
		out["clipped"] = strconv.Itoa(left)
	}
	return out
}

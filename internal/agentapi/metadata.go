package agentapi

import (
	"encoding/json"
	"sort"

	"github.com/berth-dev/berth/internal/errs"
)

// File metadata: user-defined key/value pairs stored on a file as extended
// attributes named MetadataXattrPrefix+key (E2B's envd ≥ 0.6.2 contract,
// X-Metadata-<key> headers on upload, EntryInfo.metadata on stat, list and
// move). A write that carries metadata replaces the file's set; a write
// without it leaves a new file with none.
const (
	MetadataXattrPrefix = "user.e2b."
	// MaxMetadataKeyBytes is the Linux xattr name limit (255) less the prefix.
	MaxMetadataKeyBytes = 255 - len(MetadataXattrPrefix)
	// MaxMetadataBytes bounds a file's whole set: keys with the prefix counted
	// once per key, plus values (one ext4 inode's xattr budget).
	MaxMetadataBytes = 4096
	// MaxMetadataKeys bounds the number of pairs on one file.
	MaxMetadataKeys = 64
)

// ValidateMetadata checks m against the bounds above and E2B's alphabet
// (keys: HTTP token characters, lowercase; values: printable US-ASCII).
// field names the offending input, e.g. "metadata" or "X-Metadata-"; the
// key is appended to it.
func ValidateMetadata(field string, m map[string]string) error {
	if len(m) > MaxMetadataKeys {
		return errs.Field(field, "at most %d keys per file, got %d", MaxMetadataKeys, len(m))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	total := 0
	for _, k := range keys {
		v := m[k]
		switch {
		case k == "":
			return errs.Field(field, "a key is empty")
		case len(k) > MaxMetadataKeyBytes:
			return errs.Field(field+k, "key is %d bytes, at most %d", len(k), MaxMetadataKeyBytes)
		case !tokenKey(k):
			return errs.Field(field+k, "key must be lowercase HTTP token characters (a-z 0-9 !#$%%&'*+-.^_`|~)")
		case !printable(v):
			return errs.Field(field+k, "value must be printable US-ASCII (0x20-0x7e)")
		}
		total += len(MetadataXattrPrefix) + len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errs.Field(field, "metadata is %d bytes (keys with the %q prefix, and values), at most %d", total, MetadataXattrPrefix, MaxMetadataBytes)
	}
	return nil
}

// EncodeMetadata is the agent's query form of m (JSON); nil stays absent.
func EncodeMetadata(m map[string]string) string {
	if m == nil {
		return ""
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// DecodeMetadata parses EncodeMetadata's form and validates it.
func DecodeMetadata(s string) (map[string]string, error) {
	m := map[string]string{}
	if len(s) > 2*MaxMetadataBytes+4*MaxMetadataKeys+2 {
		return nil, errs.Field("metadata", "too large")
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, errs.Field("metadata", "must be a JSON object of strings")
	}
	return m, ValidateMetadata("metadata.", m)
}

func tokenKey(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		default:
			switch c {
			case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			default:
				return false
			}
		}
	}
	return true
}

func printable(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

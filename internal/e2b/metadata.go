package e2b

import (
	"net/url"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// decodeMetadataFilter decodes the list endpoint's metadata query value
// (§3.5). The SDK URI-encodes each key and value, joins them as a query
// string, and the HTTP layer encodes that string again, so after the normal
// query decode the value is still one level encoded:
// {"user id": "a&b"} arrives decoded once as "user%2520id=a%2526b".
func decodeMetadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	joined, err := url.PathUnescape(raw)
	if err != nil {
		return nil, errs.Field("metadata", "not a URL-encoded query string: %v", err)
	}
	out := map[string]string{}
	for _, pair := range strings.Split(joined, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err := url.PathUnescape(k)
		if err != nil {
			return nil, errs.Field("metadata", "bad key encoding %q: %v", k, err)
		}
		val, err := url.PathUnescape(v)
		if err != nil {
			return nil, errs.Field("metadata", "bad value encoding for %q: %v", key, err)
		}
		if key == "" {
			return nil, errs.Field("metadata", "empty key")
		}
		out[key] = val
	}
	return out, nil
}

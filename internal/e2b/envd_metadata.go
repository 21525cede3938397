package e2b

import (
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/agentapi"
)

// uploadMetadata collects envd's X-Metadata-<key>: <value> upload headers
// (envd ≥ 0.6.2, EnvdVersion) into the file metadata the agent stores as
// user.e2b.<key> xattrs: the prefix stripped, the key lowercased, the first
// value of a repeated header. Out of bounds (agentapi.ValidateMetadata) is a
// 400 naming the header. No header: nil, the new file has no metadata (an
// upload replaces the set, as envd's does).
func uploadMetadata(h http.Header) (map[string]string, error) {
	var meta map[string]string
	for name, vals := range h {
		key, ok := strings.CutPrefix(http.CanonicalHeaderKey(name), metadataHeaderPrefix)
		if !ok || len(vals) == 0 {
			continue
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[strings.ToLower(key)] = vals[0]
	}
	if meta == nil {
		return nil, nil
	}
	return meta, agentapi.ValidateMetadata(metadataHeaderPrefix, meta)
}

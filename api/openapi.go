// Package api holds berth's API descriptions.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document for /v1, served at /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

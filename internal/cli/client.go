package cli

import (
	"errors"

	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/errs"
)

// The CLI's only way to the server is the public Go client
// (github.com/berth-dev/berth/client) over the REST API.

// defaultCacheDir is where the host's runtimes and template tarballs are
// cached (`berth bench` reads it; serve's cache_dir defaults to it).
const defaultCacheDir = "/var/cache/berth"

func newClient() (*client.Client, error) {
	return client.FromEnv()
}

var reasonKinds = func() map[string]errs.Kind {
	m := map[string]errs.Kind{}
	for _, k := range errs.Kinds() {
		m[k.String()] = k
	}
	return m
}()

// kindOf is err's kind: the server's (or the client's) for an API error,
// else the CLI's own classification.
func kindOf(err error) errs.Kind {
	var ce *client.Error
	if errors.As(err, &ce) {
		if k, ok := reasonKinds[ce.Kind]; ok {
			return k
		}
		return errs.Internal
	}
	return errs.KindOf(err)
}

func isNotFound(err error) bool { return kindOf(err) == errs.NotFound }

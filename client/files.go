package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/api/wire"
)

// WriteFiles writes the tar r (regular files and directories, names
// relative to dir) beneath dir inside the sandbox, as user ("" = the
// default user), in one request with one durability barrier (see
// wire.BatchResult).
func (s *Sandbox) WriteFiles(ctx context.Context, dir, user string, r io.Reader) (wire.BatchResult, error) {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("user", user)
	}
	var res wire.BatchResult
	err := s.c.callBody(ctx, http.MethodPost, s.path("files:batch"), s.query(q), r, "application/x-tar", &res)
	return res, err
}

// ReadFiles opens the tree beneath dir as a tar stream (symbolic links as
// links). A stream that ends without a tar trailer was cut: treat it as an
// error. The caller closes it.
func (s *Sandbox) ReadFiles(ctx context.Context, dir, user string) (io.ReadCloser, error) {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("user", user)
	}
	resp, err := s.c.Do(ctx, http.MethodGet, s.path("files:batch"), s.query(q), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

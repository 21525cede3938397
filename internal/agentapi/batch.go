package agentapi

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// Limits of one batch (a tar of many files written beneath one directory):
// the agent refuses past them and names the entry that crossed the line.
const (
	MaxBatchEntries   = 50_000
	MaxBatchBytes     = 4 << 30 // file contents, all entries together
	MaxBatchPathBytes = 4096    // one entry's name
	MaxBatchNameBytes = 255     // one component of it
)

// BatchResult answers a batch upload. Durable "syncfs" means that when it is
// returned every file and directory of the batch (contents and names) was
// flushed to the sandbox's disk by one syncfs(2) of each filesystem the
// batch wrote to: one barrier for the batch, not one per file.
type BatchResult struct {
	Dir     string       `json:"dir"`
	Files   int          `json:"files"`
	Dirs    int          `json:"dirs"`
	Bytes   int64        `json:"bytes"`
	Durable string       `json:"durable"`
	Entries []BatchEntry `json:"entries"`
	// WriteMS and SyncMS are the agent's own split of the batch: receiving
	// and writing the entries, then the syncfs barrier.
	WriteMS float64 `json:"write_ms"`
	SyncMS  float64 `json:"sync_ms"`
}

// BatchEntry is one file or directory a batch wrote; Path is absolute.
type BatchEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"` // "file" or "dir"
	Size int64  `json:"size"`
}

// CheckBatchName validates one entry name of a batch: relative, slash
// separated, no "..", ".", or empty component, no NUL, within the length
// limits. The error names the entry.
func CheckBatchName(name string) error {
	n := strings.TrimSuffix(name, "/") // tar writers mark directories so
	switch {
	case n == "":
		return errs.Field("entry", "an entry has an empty name")
	case len(n) > MaxBatchPathBytes:
		return errs.Field("entry", "%.64q...: name longer than %d bytes", n, MaxBatchPathBytes)
	case strings.HasPrefix(n, "/"):
		return errs.Field("entry", "%q: absolute names are refused (names are relative to the target directory)", n)
	case strings.ContainsRune(n, 0):
		return errs.Field("entry", "%q: NUL in name", n)
	}
	for c := range strings.SplitSeq(n, "/") {
		switch {
		case c == "" || c == ".":
			return errs.Field("entry", "%q: empty or \".\" component (names must be clean)", n)
		case c == "..":
			return errs.Field("entry", "%q: \"..\" component refused", n)
		case len(c) > MaxBatchNameBytes:
			return errs.Field("entry", "%q: a component is longer than %d bytes", n, MaxBatchNameBytes)
		}
	}
	if path.Clean(n) != n {
		return errs.Field("entry", "%q: name is not clean", n)
	}
	return nil
}

// WriteBatch streams tarBody (a POSIX/GNU tar of regular files and
// directories, names relative to dir) into dir, written as user. Entries are
// resolved beneath dir without following any symbolic link.
func (c *Client) WriteBatch(ctx context.Context, dir, user string, meta map[string]string, tarBody io.Reader) (BatchResult, error) {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("user", user)
	}
	if meta != nil {
		if err := ValidateMetadata("metadata.", meta); err != nil {
			return BatchResult{}, err
		}
		q.Set("metadata", EncodeMetadata(meta))
	}
	if tarBody == nil {
		tarBody = http.NoBody
	}
	resp, err := c.do(ctx, http.MethodPost, "/files/batch", q, tarBody, "application/x-tar")
	if err != nil {
		return BatchResult{}, err
	}
	defer resp.Body.Close()
	var res BatchResult
	if err := c.decodeBounded(resp.Body, MaxControlBytes, &res, "/files/batch"); err != nil {
		return BatchResult{}, err
	}
	if c.obs != nil {
		c.obs.FileChanged("write", res.Dir, "", res.Bytes)
	}
	return res, nil
}

// ReadBatch streams dir's tree as a tar (regular files, directories and
// symbolic links as links, never followed; other types left out).
func (c *Client) ReadBatch(ctx context.Context, dir, user string) (io.ReadCloser, error) {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("user", user)
	}
	resp, err := c.do(ctx, http.MethodGet, "/files/batch", q, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

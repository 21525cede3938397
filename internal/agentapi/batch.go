package agentapi

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth/internal/batchname"
)

// Limits of one batch (a tar of many files written beneath one directory):
// the agent refuses past them and names the entry that crossed the line.
const (
	MaxBatchEntries   = 50_000
	MaxBatchBytes     = 4 << 30                // file contents, all entries together
	MaxBatchPathBytes = batchname.MaxPathBytes // one entry's name
	MaxBatchNameBytes = batchname.MaxNameBytes // one component of it
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
	// WriteMS and SyncMS split the batch: the agent receiving and writing
	// the entries, then the syncfs barrier (the server's, on the host, for
	// the sandbox's root filesystem).
	WriteMS float64 `json:"write_ms"`
	SyncMS  float64 `json:"sync_ms"`
}

// DurableHost is the agent's Durable when asked for sync=host: it wrote the
// batch and took the barrier of every filesystem but the sandbox's root,
// which the daemon then syncs on the host (and answers "syncfs").
const DurableHost = "host"

// BatchEntry is one file or directory a batch wrote; Path is absolute.
type BatchEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"` // "file" or "dir"
	Size int64  `json:"size"`
}

// CheckBatchName validates one entry name of a batch (batchname.Check:
// the CLI checks names with it too, without linking the agent client).
func CheckBatchName(name string) error { return batchname.Check(name) }

// WriteBatch streams tarBody (a POSIX/GNU tar of regular files and
// directories, names relative to dir) into dir, written as user. Entries are
// resolved beneath dir without following any symbolic link.
func (c *Client) WriteBatch(ctx context.Context, dir, user string, meta map[string]string, tarBody io.Reader) (BatchResult, error) {
	return c.WriteBatchOptions(ctx, dir, user, meta, tarBody, BatchOptions{})
}

// BatchOptions are WriteBatchOptions' extras.
type BatchOptions struct {
	// HostSync asks the agent to leave the root filesystem's barrier to the
	// caller, who syncs the sandbox's workspace on the host after the
	// answer; whatever the agent answers, the caller must take it.
	HostSync bool
}

// WriteBatchOptions is WriteBatch with options.
func (c *Client) WriteBatchOptions(ctx context.Context, dir, user string, meta map[string]string, tarBody io.Reader, o BatchOptions) (BatchResult, error) {
	q := url.Values{"path": {dir}}
	if o.HostSync {
		q.Set("sync", "host")
	}
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

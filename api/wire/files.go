package wire

// BatchResult answers POST /v1/sandboxes/{id}/files:batch. Durable "syncfs":
// when it is returned every file and directory of the batch (contents and
// names) was flushed to the sandbox's disk by one syncfs(2) of each
// filesystem the batch wrote to — one barrier for the batch.
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

// BatchEntry is one file or directory a batch wrote; Path is absolute.
type BatchEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"` // "file" or "dir"
	Size int64  `json:"size"`
}

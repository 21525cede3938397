package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
)

// handleFilesGet serves GET /files?path=P[&username=U]: the raw bytes,
// streamed from the agent with Content-Length.
func (s *Server) handleFilesGet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		s.writeFilesError(w, r, errs.Field("path", "is required"))
		return
	}
	rc, size, err := targetFrom(r.Context()).agent.ReadFile(r.Context(), p, q.Get("username"))
	if err != nil {
		s.writeFilesError(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Debug("envd file download cut", "path", p, "err", err)
	}
}

// writtenFile is one entry of the POST /files answer.
type writtenFile struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// handleFilesPost serves POST /files: multipart/form-data (one "file" part
// per target, the raw filename being the target path) or, for envd ≥ 0.5.7
// clients, a raw application/octet-stream body for ?path=, possibly gzip.
// Bodies stream to the agent; nothing is buffered whole.
// metadataHeaderPrefix starts the headers that carry file metadata on an
// upload, in canonical form.
const metadataHeaderPrefix = "X-Metadata-"

func (s *Server) handleFilesPost(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	user, target := q.Get("username"), q.Get("path")
	meta, err := uploadMetadata(r.Header)
	if err != nil {
		s.writeFilesError(w, r, err)
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			s.writeFilesError(w, r, errs.Wrap(errs.InvalidArgument, err, "Content-Encoding: gzip body"))
			return
		}
		defer zr.Close()
		body = zr
	}
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		s.writeFilesError(w, r, errs.Field("Content-Type", "must be multipart/form-data or application/octet-stream"))
		return
	}
	var written []writtenFile
	switch mediaType {
	case "multipart/form-data":
		written, err = s.writeMultipart(r, multipart.NewReader(body, params["boundary"]), target, user, meta)
	case "application/octet-stream":
		if target == "" {
			err = errs.Field("path", "is required for an application/octet-stream upload")
			break
		}
		var e agentapi.EntryInfo
		e, err = targetFrom(r.Context()).agent.WriteFileMetadata(r.Context(), target, user, 0, meta, body)
		written = []writtenFile{{Path: e.Path, Name: e.Name, Type: "file", Metadata: e.Metadata}}
	default:
		err = errs.Field("Content-Type", "must be multipart/form-data or application/octet-stream; got %q", mediaType)
	}
	if err != nil {
		s.writeFilesError(w, r, err)
		return
	}
	if len(written) == 0 {
		s.writeFilesError(w, r, errs.Field("file", "no \"file\" part in the multipart body"))
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// writeMultipart writes each "file" part to the path in its raw filename
// (multipart.Part.FileName strips directories, so Content-Disposition is
// parsed here). A ?path= names the target of the first part. The same target
// twice in one request is rejected.
//
// SDKs send sandbox.files.write([...]) as one multipart body. Runs of small
// parts with absolute paths go to the agent as one batch (a tar beneath "/",
// one syncfs for the run instead of an fsync pair per file: agentapi's
// WriteBatch); a part over batchPartMax or with a relative path ends the run
// and is written alone, so parts land in order and nothing large is held in
// memory. In a batch, a symbolic link on the way is refused and one at the
// target replaced, where a lone write goes through it.
func (s *Server) writeMultipart(r *http.Request, mr *multipart.Reader, target, user string, meta map[string]string) ([]writtenFile, error) {
	var out []writtenFile
	seen := map[string]bool{}
	agent := targetFrom(r.Context()).agent
	var run *multipartBatch
	flush := func() error {
		if run == nil {
			return nil
		}
		res, err := run.finish()
		run = nil
		for _, e := range res.Entries {
			if e.Type == "file" {
				out = append(out, writtenFile{Path: e.Path, Name: e.Name, Type: "file", Metadata: meta})
			}
		}
		return err
	}
	buf := make([]byte, batchPartMax+1)
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			return out, flush()
		}
		if err != nil {
			_ = flush()
			return out, errs.Wrap(errs.InvalidArgument, err, "multipart body")
		}
		_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if err != nil || params["name"] != "file" {
			_ = part.Close()
			continue
		}
		p := params["filename"]
		if target != "" && len(out) == 0 && run == nil {
			p = target
		}
		if p == "" {
			_ = flush()
			return out, errs.Field("filename", "a file part needs a filename (the target path)")
		}
		if seen[p] {
			_ = flush()
			return out, errs.Field("filename", "%q appears twice in one upload", p)
		}
		seen[p] = true
		n, rerr := io.ReadFull(part, buf)
		small := errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
		if rerr != nil && !small {
			_ = part.Close()
			_ = flush()
			return out, errs.Wrap(errs.InvalidArgument, rerr, "multipart body: part %q", p)
		}
		if name, ok := batchName(p); ok && small {
			if run == nil {
				run = startMultipartBatch(r.Context(), agent, user, meta)
			}
			err := run.add(name, buf[:n])
			_ = part.Close()
			if err != nil {
				// The batch's own answer says why (e.g. the entry it refused).
				if ferr := flush(); ferr != nil {
					return out, ferr
				}
				return out, err
			}
			continue
		}
		if err := flush(); err != nil {
			_ = part.Close()
			return out, err
		}
		e, err := agent.WriteFileMetadata(r.Context(), p, user, 0, meta, io.MultiReader(bytes.NewReader(buf[:n]), part))
		_ = part.Close()
		if err != nil {
			return out, err
		}
		if seen[e.Path] && e.Path != p {
			return out, errs.Field("filename", "%q appears twice in one upload", e.Path)
		}
		seen[e.Path] = true
		out = append(out, writtenFile{Path: e.Path, Name: e.Name, Type: "file", Metadata: e.Metadata})
	}
}

// batchPartMax is the largest multipart part that joins a batch (it is
// read whole before its tar header, which needs the size, can be written).
const batchPartMax = 1 << 20

// batchName is p as an entry beneath "/" when p is absolute and names a
// file (agentapi.CheckBatchName decides the rest, in the agent).
func batchName(p string) (string, bool) {
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return "", false
	}
	c := path.Clean(p)
	if c == "/" {
		return "", false
	}
	return c[1:], true
}

// multipartBatch is one agent batch fed as parts arrive: a tar streamed
// through a pipe into WriteBatch.
type multipartBatch struct {
	pw   *io.PipeWriter
	tw   *tar.Writer
	done chan batchAnswer
}

type batchAnswer struct {
	res agentapi.BatchResult
	err error
}

func startMultipartBatch(ctx context.Context, agent *agentapi.Client, user string, meta map[string]string) *multipartBatch {
	pr, pw := io.Pipe()
	b := &multipartBatch{pw: pw, tw: tar.NewWriter(pw), done: make(chan batchAnswer, 1)}
	go func() {
		res, err := agent.WriteBatch(ctx, "/", user, meta, pr)
		// The agent answered (or failed): writers blocked on the pipe stop.
		_ = pr.CloseWithError(errs.E(errs.Unavailable, "the batch ended"))
		b.done <- batchAnswer{res, err}
	}()
	return b
}

func (b *multipartBatch) add(name string, data []byte) error {
	if err := b.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: int64(len(data))}); err != nil { // mode 0: keep an existing file's
		return err
	}
	_, err := b.tw.Write(data)
	return err
}

func (b *multipartBatch) finish() (agentapi.BatchResult, error) {
	_ = b.pw.CloseWithError(b.tw.Close())
	a := <-b.done
	return a.res, a.err
}

package e2b

import (
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"

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
func (s *Server) writeMultipart(r *http.Request, mr *multipart.Reader, target, user string, meta map[string]string) ([]writtenFile, error) {
	var out []writtenFile
	seen := map[string]bool{}
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, errs.Wrap(errs.InvalidArgument, err, "multipart body")
		}
		_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if err != nil || params["name"] != "file" {
			_ = part.Close()
			continue
		}
		p := params["filename"]
		if target != "" && len(out) == 0 {
			p = target
		}
		if p == "" {
			return out, errs.Field("filename", "a file part needs a filename (the target path)")
		}
		if seen[p] {
			return out, errs.Field("filename", "%q appears twice in one upload", p)
		}
		seen[p] = true
		e, err := targetFrom(r.Context()).agent.WriteFileMetadata(r.Context(), p, user, 0, meta, part)
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

package template

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// Image sources a pull (and a Dockerfile's FROM) accepts:
//
//	REGISTRY/REPO[:TAG|@DIGEST]      an image in a registry (docker.io by default)
//	oci-layout:DIR[:TAG|@DIGEST]     an OCI image layout directory
//	docker-archive:FILE.tar[:TAG]    a `docker save` tarball
const (
	srcLayout  = "oci-layout:"
	srcArchive = "docker-archive:"
)

// PullRequest names an image and how to reach it.
type PullRequest struct {
	Name     string // template to create or replace
	Image    string // see the source syntax above
	Username string // basic auth; "" = anonymous
	Password string
	Insecure bool // plain-HTTP registry (and self-signed TLS)
}

// BuildProgress is one line of a pull or build progress stream.
type BuildProgress struct {
	Phase   string `json:"phase"` // download, extract, step, cached, run, output, capture, done
	Message string `json:"message"`
	Bytes   int64  `json:"bytes,omitempty"`
	Step    int    `json:"step,omitempty"`  // 1-based Dockerfile step
	Steps   int    `json:"steps,omitempty"` // number of steps
	Cached  *bool  `json:"cached,omitempty"`
	Output  string `json:"output,omitempty"` // RUN output chunk
}

// imageConfig is what a template takes from an image's config.
type imageConfig struct {
	Layers   []string // top first
	Env      map[string]string
	Workdir  string
	User     string
	StartCmd []string
	Digest   string // manifest digest
}

// pull imports an image as template req.Name (Pull records it): each image layer
// becomes a layer named by its diffID (OCI whiteouts converted), and the
// image's Env, WorkingDir, User and Entrypoint+Cmd become the template's.
func (s *Service) pull(ctx context.Context, req PullRequest, progress func(BuildProgress)) (store.Template, error) {
	if err := ValidName(req.Name); err != nil {
		return store.Template{}, err
	}
	if strings.TrimSpace(req.Image) == "" {
		return store.Template{}, errs.Field("image", "must name an image (REF, oci-layout:DIR or docker-archive:FILE.tar)")
	}
	if progress == nil {
		progress = func(BuildProgress) {}
	}
	w := s.work()
	w.gc.RLock()
	defer w.gc.RUnlock()
	prev, _ := s.store().GetTemplate(ctx, req.Name)
	source := "image " + req.Image
	_, _ = s.store().PutTemplate(ctx, store.Template{Name: req.Name, State: store.TemplateBuilding, Progress: "pulling " + req.Image,
		Source: source, Layers: prev.Layers, Fingerprint: prev.Fingerprint})
	cfg, err := s.pullImage(ctx, req, progress)
	if err != nil {
		_, _ = s.store().PutTemplate(context.WithoutCancel(ctx), store.Template{Name: req.Name, State: store.TemplateFailed,
			Error: err.Error(), Source: source})
		return store.Template{}, err
	}
	t := store.Template{Name: req.Name, Layers: cfg.Layers, State: store.TemplateReady, Source: source + "@" + cfg.Digest,
		Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User, StartCmd: cfg.StartCmd}
	t.Fingerprint = FingerprintOf(t)
	out, err := s.store().PutTemplate(context.WithoutCancel(ctx), t)
	if err == nil {
		progress(BuildProgress{Phase: "done", Message: fmt.Sprintf("template %s ready: %d layers, %s", out.Name, len(out.Layers), cfg.Digest)})
	}
	return out, err
}

// pullImage resolves the image, then imports it once per digest however
// many callers ask at the same time.
func (s *Service) pullImage(ctx context.Context, req PullRequest, progress func(BuildProgress)) (imageConfig, error) {
	img, err := openImage(ctx, req)
	if err != nil {
		return imageConfig{}, err
	}
	dg, err := img.Digest()
	if err != nil {
		return imageConfig{}, pullError(req.Image, err)
	}
	progress(BuildProgress{Phase: "download", Message: "resolved " + req.Image + " to " + dg.String()})
	ch := s.work().flight.DoChan("image:"+dg.String(), func() (any, error) {
		// The first caller's ctx must not cancel the others' pull.
		return s.importImage(context.WithoutCancel(ctx), req.Image, img, progress)
	})
	select {
	case <-ctx.Done():
		return imageConfig{}, errs.Wrap(errs.Unavailable, ctx.Err(), "pull %s", req.Image)
	case r := <-ch:
		if r.Err != nil {
			return imageConfig{}, r.Err
		}
		cfg := r.Val.(imageConfig)
		if r.Shared {
			progress(BuildProgress{Phase: "download", Message: "one download shared by concurrent pulls of " + dg.String()})
		}
		cfg.Digest = dg.String()
		return cfg, nil
	}
}

func (s *Service) importImage(ctx context.Context, ref string, img v1.Image, progress func(BuildProgress)) (imageConfig, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return imageConfig{}, pullError(ref, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return imageConfig{}, errs.Field("image", "%s is a %s image; berth runs linux images", ref, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return imageConfig{}, pullError(ref, err)
	}
	var digests []string
	for i, l := range layers {
		diff, err := l.DiffID()
		if err != nil {
			return imageConfig{}, pullError(ref, err)
		}
		hex := diff.Hex
		if s.layers.HasLayer(hex) {
			progress(BuildProgress{Phase: "cached", Message: fmt.Sprintf("layer %d/%d %s already stored", i+1, len(layers), hex[:12])})
			digests = append(digests, hex)
			continue
		}
		size, _ := l.Size()
		progress(BuildProgress{Phase: "download", Message: fmt.Sprintf("layer %d/%d %s (%d bytes compressed)", i+1, len(layers), hex[:12], size)})
		_, err, _ = s.work().flight.Do("layer:"+hex, func() (any, error) {
			rc, err := l.Uncompressed()
			if err != nil {
				return nil, pullError(ref, err)
			}
			defer rc.Close()
			cr := &progressReader{r: rc, every: 4 << 20, tick: func(n int64) {
				progress(BuildProgress{Phase: "download", Message: fmt.Sprintf("layer %d/%d %s", i+1, len(layers), hex[:12]), Bytes: n})
			}}
			layer, err := s.layers.ImportOCILayer(ctx, cr, hex, nil)
			if err != nil {
				if cr.err != nil { // the download failed, not the archive
					return nil, pullError(ref, cr.err)
				}
				return nil, err
			}
			progress(BuildProgress{Phase: "extract", Message: fmt.Sprintf("layer %d/%d %s: %d entries", i+1, len(layers), hex[:12], layer.Entries), Bytes: layer.TarSize})
			return layer, nil
		})
		if err != nil {
			return imageConfig{}, err
		}
		digests = append(digests, hex)
	}
	if len(digests) == 0 {
		return imageConfig{}, errs.Field("image", "%s has no layers", ref)
	}
	slices.Reverse(digests) // overlayfs wants the top layer first
	c := cf.Config
	out := imageConfig{Layers: digests, Workdir: c.WorkingDir, User: c.User,
		StartCmd: append(slices.Clone(c.Entrypoint), c.Cmd...)}
	if len(c.Env) > 0 {
		out.Env = map[string]string{}
		for _, kv := range c.Env {
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				out.Env[k] = v
			}
		}
	}
	return out, nil
}

// openImage resolves a source to an image without downloading layers.
func openImage(ctx context.Context, req PullRequest) (v1.Image, error) {
	platform := v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	switch {
	case strings.HasPrefix(req.Image, srcArchive):
		file, tagName := strings.TrimPrefix(req.Image, srcArchive), ""
		if i := strings.LastIndex(file, ".tar:"); i >= 0 {
			file, tagName = file[:i+4], file[i+5:]
		}
		if _, err := os.Stat(file); err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, err, "image: docker archive")
		}
		var tag *name.Tag
		if tagName != "" {
			t, err := name.NewTag(tagName)
			if err != nil {
				return nil, errs.Field("image", "bad tag %q: %v", tagName, err)
			}
			tag = &t
		}
		img, err := tarball.ImageFromPath(file, tag)
		if err != nil {
			return nil, errs.Field("image", "docker archive %s: %v", file, err)
		}
		return img, nil
	case strings.HasPrefix(req.Image, srcLayout):
		return openLayout(strings.TrimPrefix(req.Image, srcLayout), platform)
	}
	var opts []name.Option
	if req.Insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(req.Image, opts...)
	if err != nil {
		return nil, errs.Field("image", "%q is not an image reference (REGISTRY/REPO[:TAG|@DIGEST], oci-layout:DIR or docker-archive:FILE.tar): %v", req.Image, err)
	}
	var auth authn.Authenticator = authn.Anonymous
	if req.Username != "" {
		auth = &authn.Basic{Username: req.Username, Password: req.Password}
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth), remote.WithPlatform(platform),
		remote.WithRetryBackoff(remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 2})}
	if req.Insecure {
		// name.Insecure allows plain HTTP; this also accepts self-signed TLS.
		tr := remote.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for with --insecure
		ropts = append(ropts, remote.WithTransport(tr))
	}
	img, err := remote.Image(ref, ropts...)
	if err != nil {
		return nil, pullError(req.Image, err)
	}
	return img, nil
}

// openLayout picks an image from an OCI layout: DIR, DIR:TAG (the
// org.opencontainers.image.ref.name annotation) or DIR@sha256:...
func openLayout(spec string, platform v1.Platform) (v1.Image, error) {
	dir, want := spec, ""
	if i := strings.LastIndex(spec, "@"); i > 0 {
		dir, want = spec[:i], spec[i+1:]
	} else if i := strings.LastIndex(spec, ":"); i > 0 && !strings.Contains(spec[i:], "/") {
		if _, err := os.Stat(spec); err != nil {
			dir, want = spec[:i], spec[i+1:]
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errs.Field("image", "oci layout %s: %v", dir, err)
	}
	for depth := 0; depth < 3; depth++ {
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, errs.Field("image", "oci layout %s: %v", dir, err)
		}
		var pick *v1.Descriptor
		for i := range im.Manifests {
			m := &im.Manifests[i]
			switch {
			case want != "" && (m.Digest.String() == want || m.Annotations["org.opencontainers.image.ref.name"] == want):
			case want == "" && (len(im.Manifests) == 1 || m.Platform == nil || m.Platform.Satisfies(platform)):
			default:
				continue
			}
			pick = m
			break
		}
		if pick == nil {
			return nil, errs.Field("image", "oci layout %s has no image matching %q for %s/%s", dir, want, platform.OS, platform.Architecture)
		}
		if pick.MediaType.IsIndex() {
			if idx, err = idx.ImageIndex(pick.Digest); err != nil {
				return nil, errs.Field("image", "oci layout %s: %v", dir, err)
			}
			want = ""
			continue
		}
		img, err := idx.Image(pick.Digest)
		if err != nil {
			return nil, errs.Field("image", "oci layout %s: %v", dir, err)
		}
		return img, nil
	}
	return nil, errs.Field("image", "oci layout %s: indexes nested too deep", dir)
}

// pullError classifies a registry failure into an error kind with a
// message that says what went wrong where.
func pullError(ref string, err error) error {
	var te *transport.Error
	var ne net.Error
	var ue *url.Error
	var se *json.SyntaxError
	switch {
	case errs.KindOf(err) != errs.Internal:
		return err
	case errors.As(err, &te):
		switch te.StatusCode {
		case 401:
			return errs.Wrap(errs.Unauthenticated, err, "pull %s: the registry wants credentials (--username, --password-stdin)", ref)
		case 403:
			return errs.Wrap(errs.PermissionDenied, err, "pull %s: access denied", ref)
		case 404:
			return errs.Wrap(errs.NotFound, err, "pull %s: no such image", ref)
		}
		return errs.Wrap(errs.Unavailable, err, "pull %s: registry error", ref)
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &ne), errors.As(err, &ue):
		return errs.Wrap(errs.Unavailable, err, "pull %s: registry unreachable", ref)
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
		return errs.Wrap(errs.Unavailable, err, "pull %s: the registry sent an invalid response", ref)
	}
	return errs.Wrap(errs.Unavailable, err, "pull %s: invalid image or registry response", ref)
}

// progressReader counts bytes and remembers a read error (to tell a
// network failure from a bad archive).
type progressReader struct {
	r     io.Reader
	n     int64
	last  int64
	every int64
	tick  func(int64)
	err   error
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n-p.last >= p.every {
		p.last = p.n
		p.tick(p.n)
	}
	if err != nil && err != io.EOF {
		p.err = err
	}
	return n, err
}

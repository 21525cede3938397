package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/store"
)

// BuildOwner owns the short-lived sandboxes that run Dockerfile RUN steps.
const BuildOwner = "berth-build"

// buildCacheKey prefixes the settings that map a step fingerprint to the
// layer it produced. An entry whose layer was garbage-collected is a miss.
const buildCacheKey = "build-cache:"

// BuildRequest is one Dockerfile build.
type BuildRequest struct {
	Name       string            // template to create or replace
	ContextDir string            // the unpacked build context
	Dockerfile string            // path inside the context ("Dockerfile")
	BuildArgs  map[string]string // --build-arg
	Network    string            // RUN steps' egress: "" (allow-all when networking is on), allow-all, deny-all
	NoCache    bool
}

// buildState is the image being built, step by step.
type buildState struct {
	fp         string   // fingerprint chain so far
	layers     []string // top first
	env        map[string]string
	args       map[string]string // ARGs in scope (not persisted)
	workdir    string
	user       string
	cmd, entry []string
}

func (b *buildState) vars() map[string]string {
	v := map[string]string{}
	for k, x := range b.args {
		v[k] = x
	}
	for k, x := range b.env {
		v[k] = x
	}
	return v
}

func chain(parent string, parts ...string) string {
	h := sha256.New()
	io.WriteString(h, parent)
	for _, p := range parts {
		h.Write([]byte{0})
		io.WriteString(h, p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// build builds a Dockerfile into template req.Name (Build records it) without a
// Docker engine: FROM a template or an image (pulled), RUN in a berth
// sandbox whose captured workspace becomes the step's layer, COPY/ADD from
// the context as layers, ENV/WORKDIR/USER/ARG/CMD/ENTRYPOINT as metadata.
// Every step is cached by a fingerprint of its parent, its text after ARG
// and ENV substitution and (COPY/ADD) the content it reads.
func (s *Service) build(ctx context.Context, req BuildRequest, progress func(BuildProgress)) (store.Template, error) {
	if err := ValidName(req.Name); err != nil {
		return store.Template{}, err
	}
	if progress == nil {
		progress = func(BuildProgress) {}
	}
	if req.Dockerfile == "" {
		req.Dockerfile = "Dockerfile"
	}
	root, err := os.OpenRoot(req.ContextDir)
	if err != nil {
		return store.Template{}, errs.Wrap(errs.Internal, err, "open build context")
	}
	src, err := root.ReadFile(path.Clean(req.Dockerfile))
	root.Close()
	if err != nil {
		return store.Template{}, errs.Field("dockerfile", "%s: not found in the build context: %v", req.Dockerfile, err)
	}
	df, err := ParseDockerfile(req.Dockerfile, src)
	if err != nil {
		return store.Template{}, err
	}
	w := s.work()
	w.gc.RLock()
	defer w.gc.RUnlock()
	start := time.Now()
	source := "dockerfile " + req.Dockerfile
	prev, _ := s.store().GetTemplate(ctx, req.Name)
	_, _ = s.store().PutTemplate(ctx, store.Template{Name: req.Name, State: store.TemplateBuilding, Progress: "building",
		Source: source, Layers: prev.Layers, Fingerprint: prev.Fingerprint, StartCmd: prev.StartCmd, Env: prev.Env,
		Workdir: prev.Workdir, User: prev.User})
	st, err := s.runBuild(ctx, req, df, progress)
	if err != nil {
		// A failed rebuild keeps the last good template usable.
		rec := prev
		if prev.State != store.TemplateReady {
			rec = store.Template{Name: req.Name, Source: source, State: store.TemplateFailed, Error: err.Error()}
		}
		_, _ = s.store().PutTemplate(context.WithoutCancel(ctx), rec)
		return store.Template{}, err
	}
	t := store.Template{Name: req.Name, Layers: st.layers, State: store.TemplateReady, Source: source,
		Env: st.env, Workdir: st.workdir, User: st.user, StartCmd: append(append([]string{}, st.entry...), st.cmd...)}
	t.Fingerprint = FingerprintOf(t)
	out, err := s.store().PutTemplate(context.WithoutCancel(ctx), t)
	if err != nil {
		return store.Template{}, err
	}
	progress(BuildProgress{Phase: "done", Message: fmt.Sprintf("template %s ready: %d layers in %s", out.Name, len(out.Layers),
		time.Since(start).Round(time.Millisecond))})
	return out, nil
}

func (s *Service) runBuild(ctx context.Context, req BuildRequest, df *Dockerfile, progress func(BuildProgress)) (*buildState, error) {
	st := &buildState{env: map[string]string{}, args: map[string]string{}}
	global := map[string]string{} // ARGs before FROM
	n := len(df.Steps)
	for i, ins := range df.Steps {
		step := i + 1
		at := func(err error) error { return stepError(df.File, ins, err) }
		note := func(phase, msg string, cached *bool) {
			progress(BuildProgress{Phase: phase, Step: step, Steps: n, Message: msg, Cached: cached})
		}
		vars := st.vars()
		switch ins.Cmd {
		case "ARG":
			k, def, hasDef := strings.Cut(ins.Args[0], "=")
			target := st.args
			if st.fp == "" {
				target = global
			} else if v, ok := global[k]; ok && !hasDef {
				def, hasDef = v, true
			}
			if hasDef {
				v, err := Expand(def, vars)
				if err != nil {
					return nil, at(err)
				}
				def = v
			}
			if v, ok := req.BuildArgs[k]; ok {
				def = v
			}
			target[k] = def
			st.fp = chain(st.fp, "ARG", k, def)
			note("step", fmt.Sprintf("ARG %s", k), nil)
			continue
		case "FROM":
			ref, err := Expand(ins.Args[0], global)
			if err != nil {
				return nil, at(err)
			}
			note("step", "FROM "+ref, nil)
			if err := s.buildFrom(ctx, st, ref, req, progress); err != nil {
				return nil, at(err)
			}
			continue
		case "ENV":
			pairs, err := ins.EnvPairs(vars)
			if err != nil {
				return nil, at(err)
			}
			for _, p := range pairs {
				st.env[p[0]] = p[1]
				st.fp = chain(st.fp, "ENV", p[0], p[1])
			}
			note("step", "ENV "+ins.Raw, nil)
			continue
		case "USER":
			u, err := Expand(ins.Args[0], vars)
			if err != nil {
				return nil, at(err)
			}
			st.user = u
			st.fp = chain(st.fp, "USER", u)
			note("step", "USER "+u, nil)
			continue
		case "CMD", "ENTRYPOINT":
			argv := ins.Args
			if !ins.JSON {
				argv = []string{"/bin/sh", "-c", ins.Raw}
			}
			if ins.Cmd == "CMD" {
				st.cmd = argv
			} else {
				st.entry, st.cmd = argv, nil
			}
			st.fp = chain(st.fp, append([]string{ins.Cmd}, argv...)...)
			note("step", ins.Cmd+" "+strings.Join(argv, " "), nil)
			continue
		}
		// Steps that make a layer.
		var (
			key   string
			mk    func() (Layer, error)
			label = ins.Cmd + " " + ins.Raw
		)
		switch ins.Cmd {
		case "WORKDIR":
			p, err := Expand(ins.Args[0], vars)
			if err != nil {
				return nil, at(err)
			}
			if !path.IsAbs(p) {
				p = path.Join("/", st.workdir, p)
			}
			st.workdir = path.Clean(p)
			lowers, err := s.layerDirs(st.layers)
			if err != nil {
				return nil, at(err)
			}
			if _, exists := PathInLayers(lowers, st.workdir); exists {
				st.fp = chain(st.fp, "WORKDIR", st.workdir)
				note("step", "WORKDIR "+st.workdir, nil)
				continue
			}
			key = chain(st.fp, "WORKDIR", st.workdir)
			wd := st.workdir
			mk = func() (Layer, error) {
				return s.layers.ImportDir(ctx, func(dir string) error {
					return os.MkdirAll(filepath.Join(dir, wd), 0o755)
				})
			}
		case "COPY", "ADD":
			spec, k, err := s.copyStep(ctx, st, ins, vars, req.ContextDir)
			if err != nil {
				return nil, at(err)
			}
			key = k
			mk = func() (Layer, error) {
				lowers, err := s.layerDirs(st.layers)
				if err != nil {
					return Layer{}, err
				}
				isDir, _ := PathInLayers(lowers, spec.Dest)
				srcs, err := spec.ResolveSources(req.ContextDir)
				if err != nil {
					return Layer{}, err
				}
				return s.layers.ImportDir(ctx, func(dir string) error { return spec.Fill(req.ContextDir, srcs, isDir, dir) })
			}
		case "RUN":
			argv := ins.Args
			if !ins.JSON {
				argv = []string{"/bin/sh", "-c", ins.Raw}
			}
			var argKV []string
			for k, v := range st.args {
				argKV = append(argKV, k+"="+v)
			}
			sort.Strings(argKV)
			key = chain(st.fp, append([]string{"RUN", strings.Join(argKV, "\x01"), req.Network}, argv...)...)
			stCopy := *st
			mk = func() (Layer, error) { return s.runStep(ctx, &stCopy, argv, req.Network, step, n, progress) }
		}
		layer, cached, err := s.cachedStep(ctx, key, req.NoCache, mk)
		if err != nil {
			return nil, at(err)
		}
		st.fp = key
		st.layers = append([]string{layer.Digest}, st.layers...)
		msg := fmt.Sprintf("%s -> layer %s", label, layer.Digest[:12])
		progress(BuildProgress{Phase: "step", Step: step, Steps: n, Message: msg, Cached: &cached, Bytes: layer.TarSize})
	}
	if len(st.layers) == 0 {
		return nil, errs.E(errs.InvalidArgument, "%s: the build produced no layers", df.File)
	}
	return st, nil
}

// stepError puts file:line in front of a step's failure, keeping its kind.
func stepError(file string, ins Instruction, err error) error {
	var e *errs.Error
	if errors.As(err, &e) && strings.HasPrefix(e.Message, file+":") {
		return err
	}
	return &errs.Error{Kind: errs.KindOf(err), Field: "dockerfile", Err: err,
		Message: fmt.Sprintf("%s:%d: %s", file, ins.Line, ins.Cmd)}
}

// cachedStep returns the layer cached under key, or makes and caches it.
func (s *Service) cachedStep(ctx context.Context, key string, noCache bool, mk func() (Layer, error)) (Layer, bool, error) {
	if !noCache {
		if dg, err := s.store().GetSetting(ctx, buildCacheKey+key); err == nil && s.layers.HasLayer(dg) {
			l, err := s.layers.Layer(dg)
			return l, true, err
		}
	}
	l, err := mk()
	if err != nil {
		return Layer{}, false, err
	}
	if err := s.store().PutSetting(ctx, buildCacheKey+key, l.Digest); err != nil {
		s.log.Warn("build cache write", "err", err)
	}
	return l, false, nil
}

func (s *Service) layerDirs(digests []string) ([]string, error) {
	return s.layers.Lowers("build", digests)
}

// buildFrom starts the build from a template of this server or, failing
// that, an image (pulled like `berth template pull`).
func (s *Service) buildFrom(ctx context.Context, st *buildState, ref string, req BuildRequest, progress func(BuildProgress)) error {
	if t, err := s.store().GetTemplate(ctx, ref); err == nil {
		if t.State != store.TemplateReady {
			return errs.E(errs.FailedPrecondition, "template %s is %s", ref, t.State)
		}
		st.layers, st.workdir, st.user = append([]string{}, t.Layers...), t.Workdir, t.User
		for k, v := range t.Env {
			st.env[k] = v
		}
		st.cmd = t.StartCmd
		st.fp = chain(st.fp, "FROM template", t.Fingerprint)
		return nil
	}
	cfg, err := s.pullImage(ctx, PullRequest{Image: ref}, progress)
	if err != nil {
		return errs.Wrap(errs.KindOf(err), err, "FROM %s: not a template here, and pulling it as an image failed", ref)
	}
	st.layers, st.workdir, st.user, st.cmd = cfg.Layers, cfg.Workdir, cfg.User, cfg.StartCmd
	for k, v := range cfg.Env {
		st.env[k] = v
	}
	st.fp = chain(st.fp, "FROM image", cfg.Digest)
	return nil
}

// copyStep resolves a COPY/ADD and its cache key (which covers the bytes it reads).
func (s *Service) copyStep(ctx context.Context, st *buildState, ins Instruction, vars map[string]string, ctxDir string) (CopySpec, string, error) {
	var spec CopySpec
	words := make([]string, len(ins.Args))
	for i, a := range ins.Args {
		v, err := Expand(a, vars)
		if err != nil {
			return spec, "", err
		}
		words[i] = v
	}
	dest := words[len(words)-1]
	if !path.IsAbs(dest) {
		slash := strings.HasSuffix(dest, "/")
		dest = path.Join("/", st.workdir, dest)
		if slash {
			dest += "/"
		}
	}
	uid, gid, err := ParseChown(ins.Flags["chown"])
	if err != nil {
		return spec, "", err
	}
	mode, err := ParseChmod(ins.Flags["chmod"])
	if err != nil {
		return spec, "", err
	}
	spec = CopySpec{Sources: words[:len(words)-1], Dest: dest, UID: uid, GID: gid, Mode: mode}
	srcs, err := spec.ResolveSources(ctxDir)
	if err != nil {
		return spec, "", err
	}
	sum, err := spec.ContentHash(ctx, ctxDir, srcs)
	if err != nil {
		return spec, "", err
	}
	return spec, chain(st.fp, ins.Cmd, strings.Join(words, "\x01"), fmt.Sprintf("%d:%d:%o", uid, gid, mode), sum), nil
}

// runStep runs argv in a fresh sandbox on the layers so far and captures
// its workspace as the step's layer. A failing command leaves no layer.
func (s *Service) runStep(ctx context.Context, st *buildState, argv []string, network string, step, n int, progress func(BuildProgress)) (Layer, error) {
	sb, err := s.core.StartBuildSandbox(ctx, st.layers, network, func(msg string) {
		progress(BuildProgress{Phase: "run", Step: step, Steps: n, Message: msg})
	})
	if err != nil {
		return Layer{}, err
	}
	defer func() {
		if err := s.core.RemoveBuildSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
			s.log.Error("remove build sandbox", "sandbox_id", sb.ID, "err", err)
		}
	}()
	done := s.core.OpenStream(sb.ID) // the reaper leaves a running step alone
	defer done()
	env := map[string]string{}
	for k, v := range st.args {
		env[k] = v
	}
	for k, v := range st.env {
		env[k] = v
	}
	user := st.user
	if user == "" {
		user = "root" // Dockerfile semantics; the agent's default is "user"
	}
	cwd := st.workdir
	if cwd == "" {
		cwd = "/"
	}
	stream, err := s.core.AgentClient(sb.ID).Exec(ctx, agentapi.ExecRequest{Argv: argv, Env: env, Cwd: cwd, User: user}, 0)
	if err != nil {
		return Layer{}, errs.Wrap(errs.KindOf(err), err, "RUN")
	}
	defer stream.Close()
	var tail []byte
	for {
		ev, err := stream.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Layer{}, errs.Reclassify(errs.Unavailable, err, "RUN")
		}
		switch ev.Type {
		case "stdout", "stderr":
			progress(BuildProgress{Phase: "output", Step: step, Steps: n, Output: string(ev.Data)})
			tail = append(tail, ev.Data...)
			if len(tail) > 4096 {
				tail = tail[len(tail)-4096:]
			}
		case "error":
			return Layer{}, errs.E(errs.InvalidArgument, "%q: %s", strings.Join(argv, " "), ev.Error)
		case "exit":
			if ev.ExitCode != 0 || !ev.Exited {
				return Layer{}, errs.E(errs.FailedPrecondition, "%q failed (%s); output ends with:\n%s",
					strings.Join(argv, " "), ev.Status, strings.TrimRight(string(tail), "\n"))
			}
			progress(BuildProgress{Phase: "capture", Step: step, Steps: n, Message: "capturing the step's workspace"})
			unlock := s.core.Lock(sb.ID)
			defer unlock()
			return s.core.CaptureWorkspace(ctx, sb)
		}
	}
	return Layer{}, errs.E(errs.Unavailable, "RUN: the stream ended without an exit status")
}

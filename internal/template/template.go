// Package template holds berth's environments: a content-addressed store of
// read-only rootfs layers (layers/<sha256>/ under the data dir), safe import
// of rootfs tarballs, and the built-in template sources ("default", a Debian
// bookworm rootfs made with debootstrap, and "tiny", a busybox rootfs).
//
// Template records are pure data here; the SQLite store persists them. The
// template Service (service.go) is the template domain of a server: import,
// registry pull, Dockerfile build, remove and layer GC, with what it needs
// from the lifecycle core behind the narrow Core interface. This package
// contains no SQL.
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/sandbox"
)

// Names of the built-in templates.
const (
	DefaultName = "default" // Debian bookworm (BuildDefault)
	TinyName    = "tiny"    // busybox (BuildTiny), for fast tests
)

// BuildState is where a template's build is.
type BuildState string

const (
	StateBuilding BuildState = "building"
	StateReady    BuildState = "ready"
	StateFailed   BuildState = "failed"
)

// Template is one environment as stored.
type Template struct {
	Name string `json:"name"`
	// Layers are layer digests (see Store), ordered top-first as overlayfs
	// lowerdir wants them.
	Layers      []string `json:"layers"`
	Fingerprint string   `json:"fingerprint"` // see Fingerprint
	// StartCmd runs inside the sandbox after the agent is up; empty = none.
	StartCmd  []string          `json:"start_cmd,omitempty"`
	Env       []string          `json:"env,omitempty"` // KEY=VALUE, defaults for every process
	Resources sandbox.Resources `json:"resources"`
	State     BuildState        `json:"state"`
	Progress  string            `json:"progress,omitempty"` // last progress message while building
	Error     string            `json:"error,omitempty"`    // why the build failed
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// Progress is one step of a long operation (build or import), streamed to
// callers; Message is for humans, Phase for machines.
type Progress struct {
	Phase   string `json:"phase"` // "download", "extract", "install", "configure", "pack", "import"
	Message string `json:"message"`
	Bytes   int64  `json:"bytes,omitempty"` // bytes processed so far, when known
}

// Phases reported in Progress.
const (
	PhaseDownload  = "download"
	PhaseExtract   = "extract"
	PhaseInstall   = "install"
	PhaseConfigure = "configure"
	PhasePack      = "pack"
	PhaseImport    = "import"
	PhaseCached    = "cached"
)

var nameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateName checks a template name: 1–63 chars of lowercase letters,
// digits, '.', '_' and '-', starting with a letter or digit.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return errs.Field("name", "template name %q must match %s", name, nameRE.String())
	}
	return nil
}

// Fingerprint identifies a template's environment by content: its ordered
// layers, start command and environment. Resources are not part of it (warm
// pools key by fingerprint and resource shape separately). The result is
// "sha256:<hex>".
func Fingerprint(layers, startCmd, env []string) string {
	h := sha256.New()
	// Length-prefixed fields so that no two different inputs collide.
	write := func(tag string, items []string) {
		h.Write([]byte(tag))
		for _, s := range items {
			h.Write([]byte{0})
			h.Write([]byte(s))
		}
		h.Write([]byte{'\n'})
	}
	write("layers", layers)
	write("start", startCmd)
	write("env", env)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Validate checks a record before it is stored.
func (t Template) Validate() error {
	if err := ValidateName(t.Name); err != nil {
		return err
	}
	switch t.State {
	case StateBuilding, StateFailed:
	case StateReady:
		if len(t.Layers) == 0 {
			return errs.Field("layers", "a ready template needs at least one layer")
		}
	default:
		return errs.Field("state", "%q is not one of building, ready, failed", t.State)
	}
	for _, d := range t.Layers {
		if err := ValidateDigest(d); err != nil {
			return err
		}
	}
	for _, kv := range t.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return errs.Field("env", "%q is not KEY=VALUE", kv)
		}
	}
	return nil
}

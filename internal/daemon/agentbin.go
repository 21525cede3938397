package daemon

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// installAgent copies the berth-agent binary into the data dir under its
// content hash and returns that path. Sandboxes bind-mount this copy, never
// the build output: rebuilding or upgrading berth must not swap the binary
// under running sandboxes (CRIU then sees a deleted executable and refuses
// to checkpoint), and a memory image must find the exact binary it was
// taken with.
func installAgent(dataDir, src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", errs.Wrap(errs.FailedPrecondition, err, "agent binary")
	}
	defer f.Close()
	if err := checkStatic(f); err != nil {
		return "", errs.Field("agent_path", "%s: %v; build it with CGO_ENABLED=0 go build ./cmd/berth-agent", src, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", errs.Wrap(errs.Internal, err, "hash agent binary")
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	dst := filepath.Join(dataDir, "agent", sum, "berth-agent")
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", errs.Wrap(errs.Internal, err, "install agent")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agent-*")
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "install agent")
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close()
		return "", errs.Wrap(errs.Internal, err, "install agent")
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dst, errs.Wrap(errs.Internal, os.Rename(tmp.Name(), dst), "install agent")
}

// checkStatic refuses a dynamically linked agent: it runs as PID 1 in root
// filesystems that may have no (or another) C library.
func checkStatic(f *os.File) error {
	ef, err := elf.NewFile(f)
	if err != nil {
		return err
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			return errs.E(errs.InvalidArgument, "dynamically linked (needs an ELF interpreter)")
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

// shortError keeps an event message readable: the first line plus the
// lines that say "Error", at most ~600 bytes. The full text goes to the log.
func shortError(err error) string {
	s := err.Error()
	if len(s) <= 600 {
		return s
	}
	lines := strings.Split(s, "\n")
	out := []string{lines[0]}
	for _, l := range lines[1:] {
		if strings.Contains(l, "Error") || strings.Contains(l, "error") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	msg := strings.Join(out, "\n")
	if len(msg) > 600 {
		msg = msg[:600] + "…"
	}
	return msg
}

package daemon

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// agentInstall is the agent as sandboxes see it: a read-only directory
// mounted at /.berth holding berth-agent (and, for a dynamically linked
// build, its ELF interpreter and libraries), and the PID 1 command line.
type agentInstall struct {
	Dir  string
	Args []string
}

// installAgent copies the berth-agent binary into the data dir under its
// content hash. Sandboxes bind-mount this copy, never the build output:
// rebuilding or upgrading berth must not swap the binary under running
// sandboxes (CRIU then sees a deleted executable and refuses to
// checkpoint), and a memory image must find the exact binary it was taken
// with. A dynamically linked agent (a plain `go build` on a host with a C
// compiler) brings its loader and libraries along and is started through
// the loader, so it runs in any root filesystem, even one without a libc.
func installAgent(dataDir, src string) (agentInstall, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return agentInstall{}, errs.Wrap(errs.FailedPrecondition, err, "agent binary")
	}
	interp, err := elfInterpreter(b)
	if err != nil {
		return agentInstall{}, errs.Field("agent_path", "%s is not an ELF executable: %v", src, err)
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(dataDir, "agent", hex.EncodeToString(sum[:])[:16])
	inst := agentInstall{Dir: dir, Args: []string{agentInSandbox}}
	var libs []string
	if interp != "" {
		if libs, err = sharedLibs(src); err != nil {
			return agentInstall{}, err
		}
		inst.Args = []string{agentMount + "/lib/" + filepath.Base(interp), "--library-path", agentMount + "/lib", agentInSandbox}
	}
	if _, err := os.Stat(filepath.Join(dir, "berth-agent")); err == nil {
		return inst, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(dataDir), ".agent-*")
	if err != nil {
		return agentInstall{}, errs.Wrap(errs.Internal, err, "install agent")
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return agentInstall{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "berth-agent"), b, 0o755); err != nil {
		return agentInstall{}, errs.Wrap(errs.Internal, err, "install agent")
	}
	for _, lib := range libs {
		data, err := os.ReadFile(lib)
		if err != nil {
			return agentInstall{}, errs.Wrap(errs.Internal, err, "copy agent library")
		}
		if err := os.MkdirAll(filepath.Join(tmp, "lib"), 0o755); err != nil {
			return agentInstall{}, err
		}
		if err := os.WriteFile(filepath.Join(tmp, "lib", filepath.Base(lib)), data, 0o755); err != nil {
			return agentInstall{}, errs.Wrap(errs.Internal, err, "copy agent library")
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return agentInstall{}, err
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, statErr := os.Stat(filepath.Join(dir, "berth-agent")); statErr != nil {
			return agentInstall{}, errs.Wrap(errs.Internal, err, "install agent")
		}
	}
	return inst, nil
}

// elfInterpreter returns the ELF interpreter of a dynamically linked
// executable, or "" for a static one.
func elfInterpreter(b []byte) (string, error) {
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				return "", err
			}
			return strings.TrimRight(string(data), "\x00"), nil
		}
	}
	return "", nil
}

// sharedLibs lists the host paths of a binary's loader and libraries, as ldd resolves them.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, errs.Field("agent_path", "%s is dynamically linked and ldd failed (%v); build it with CGO_ENABLED=0", bin, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
			libs = append(libs, f[2])
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

package oci

import (
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/runtime"
)

// Backend names.
const (
	Runc  = "runc"
	Runsc = "runsc"
)

// ociVersion is the spec version written to config.json; runc 1.1 speaks 1.0.2.
const ociVersion = "1.0.2"

// cfsPeriod is the CFS period in µs; quota = CPUMillis * cfsPeriod / 1000.
const cfsPeriod = 100000

// nofile is the soft and hard RLIMIT_NOFILE of the sandbox's processes.
const nofile = 1048576

// defaultPath is PATH when Spec.Env sets none.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// capabilities is Docker's default set: enough for an agent running as
// PID 1 to drop to a user (setuid/setgid/chown), nothing that reaches
// the host kernel's administrative surface.
var capabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID",
	"CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

// maskedPaths and readonlyPaths are Docker's defaults.
var maskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
	"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// idPattern is the sandbox id alphabet (sandbox package: lowercase letters
// and digits); runsc and cgroup paths need nothing more.
var idPattern = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CgroupPath is the cgroup (v1: under every controller's mount) of a sandbox.
// Absolute, so it does not depend on the daemon's own cgroup.
func CgroupPath(id string) string { return "/berth/" + id }

// GenerateSpec turns a sandbox spec into the OCI config.json for backend
// (Runc or Runsc). Pure: same input, same output.
func GenerateSpec(s runtime.Spec, backend string) (*specs.Spec, error) {
	if err := validate(s, backend); err != nil {
		return nil, err
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	env := slices.Clone(s.Env)
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{defaultPath}, env...)
	}
	caps := slices.Clone(capabilities)

	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
		{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
		{Type: specs.NetworkNamespace, Path: s.NetNSPath},
	}

	if s.UserNS != nil {
		// runc then also mounts /proc, /sys, /dev/* for the new user
		// namespace; caps are those of root inside it, not on the host.
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
	}

	spec := &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: slices.Clone(s.Args),
			Env:  env,
			Cwd:  cwd,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}},
			NoNewPrivileges: noNewPrivileges(s, backend),
		},
		Root:     &specs.Root{Path: s.RootFS},
		Hostname: hostname,
		Mounts:   append(standardMounts(s), extraMounts(s.Mounts)...),
		Linux: &specs.Linux{
			CgroupsPath:   CgroupPath(s.ID),
			Resources:     resources(s.Resources, backend),
			Namespaces:    namespaces,
			MaskedPaths:   slices.Clone(maskedPaths),
			ReadonlyPaths: slices.Clone(readonlyPaths),
		},
	}
	if m := s.UserNS; m != nil {
		idm := []specs.LinuxIDMapping{{ContainerID: 0, HostID: m.HostID, Size: m.Size}}
		spec.Linux.UIDMappings, spec.Linux.GIDMappings = idm, slices.Clone(idm)
	}
	if backend == Runc {
		// runsc ignores the spec's seccomp (the Sentry is its syscall
		// filter), so it is left out rather than pretending.
		spec.Linux.Seccomp = defaultSeccomp()
	}
	return spec, nil
}

// noNewPrivileges decides whether setuid binaries (the template's sudo) may
// raise a process's privileges inside the sandbox. On runsc the Sentry
// implements setuid itself, so the most a setuid binary reaches is root
// inside gVisor. On runc with a user namespace, root inside maps to an
// unprivileged host uid, so a setuid binary can only reach a uid of the
// sandbox's own mapping. Only on runc without a user namespace (--no-userns)
// would setuid reach real host root (capabilities still bounded), so there
// no-new-privileges stays on and sudo does not work.
func noNewPrivileges(s runtime.Spec, backend string) bool {
	return backend == Runc && s.UserNS == nil
}

func validate(s runtime.Spec, backend string) error {
	if backend != Runc && backend != Runsc {
		return errs.Field("runtime", "unknown backend %q (allowed: runc, runsc)", backend)
	}
	if !idPattern.MatchString(s.ID) {
		return errs.Field("id", "%q is not a valid id (lowercase letters, digits, '-')", s.ID)
	}
	if !filepath.IsAbs(s.RootFS) {
		return errs.Field("rootfs", "must be an absolute path, got %q", s.RootFS)
	}
	if !filepath.IsAbs(s.BundleDir) {
		return errs.Field("bundle_dir", "must be an absolute path, got %q", s.BundleDir)
	}
	if len(s.Args) == 0 {
		return errs.Field("args", "PID 1 command is required")
	}
	if s.Cwd != "" && !filepath.IsAbs(s.Cwd) {
		return errs.Field("cwd", "must be absolute, got %q", s.Cwd)
	}
	if s.NetNSPath != "" && !filepath.IsAbs(s.NetNSPath) {
		return errs.Field("netns_path", "must be absolute, got %q", s.NetNSPath)
	}
	for i, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return errs.Field("mounts", "mount %d: source and target must be absolute (%q -> %q)", i, m.Source, m.Target)
		}
	}
	if m := s.UserNS; m != nil {
		if backend != Runc {
			return errs.Field("user_ns", "only runc runs sandboxes in a user namespace (runsc isolates with gVisor)")
		}
		if m.HostID == 0 || m.Size == 0 || uint64(m.HostID)+uint64(m.Size) > 1<<32-1 {
			return errs.Field("user_ns", "host range %d+%d must be non-zero and fit in 32 bits", m.HostID, m.Size)
		}
	}
	r := s.Resources
	if r.CPUMillis < 0 || r.MemoryBytes < 0 || r.Pids < 0 {
		return errs.Field("resources", "limits must not be negative (%+v)", r)
	}
	if r.MemoryBytes > 0 && r.MemoryBytes < 4<<20 {
		return errs.Field("resources", "memory limit %d bytes is below 4 MiB", r.MemoryBytes)
	}
	return nil
}

// runscPidsOverhead is added to a runsc sandbox's pids limit: runsc
// enforces it only on the host cgroup, where the Sentry's and gofer's own
// threads count too (a limit of 16 kills the sandbox at start). Guest tasks
// under systrap need host stub threads, so the limit still stops a fork bomb.
const runscPidsOverhead = 64

func resources(r runtime.Resources, backend string) *specs.LinuxResources {
	out := &specs.LinuxResources{Devices: deviceRules()}
	if r.CPUMillis > 0 {
		quota := int64(r.CPUMillis) * cfsPeriod / 1000
		period := uint64(cfsPeriod)
		out.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if r.MemoryBytes > 0 {
		limit := r.MemoryBytes
		swap := r.MemoryBytes // memory+swap = memory: no swap
		out.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &swap}
	}
	if r.Pids > 0 {
		limit := r.Pids
		if backend == Runsc {
			limit += runscPidsOverhead
		}
		out.Pids = &specs.LinuxPids{Limit: limit}
	}
	return out
}

func deviceRules() []specs.LinuxDeviceCgroup {
	c := func(major, minor int64) specs.LinuxDeviceCgroup {
		return specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"}
	}
	wildcard := int64(-1)
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		c(1, 3), c(1, 5), c(1, 7), c(1, 8), c(1, 9), // null zero full random urandom
		c(5, 0), c(5, 1), c(5, 2), // tty console ptmx
		{Allow: true, Type: "c", Major: ptr(int64(136)), Minor: &wildcard, Access: "rwm"}, // pts
	}
}

// SysfsDir is where a user-namespaced sandbox's /sys is mounted on the host
// while the runtime starts it (see needsHostSysfs).
func SysfsDir(bundle string) string { return filepath.Join(bundle, "sysfs") }

// needsHostSysfs: sysfs may only be mounted by the user namespace owning the
// network namespace. A sandbox in its own user namespace that joins a netns
// the daemon made cannot mount it, so berth mounts it from inside the netns
// (its /sys/class/net then shows the sandbox's devices, not the host's) and
// the sandbox gets a read-only bind of that.
func needsHostSysfs(s runtime.Spec) bool { return s.UserNS != nil && s.NetNSPath != "" }

func standardMounts(s runtime.Spec) []specs.Mount {
	sys := specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
	if needsHostSysfs(s) {
		sys = specs.Mount{Destination: "/sys", Type: "bind", Source: SysfsDir(s.BundleDir), Options: []string{"rbind", "rprivate", "nosuid", "noexec", "nodev", "ro"}}
	}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		sys,
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

func extraMounts(ms []runtime.Mount) []specs.Mount {
	out := make([]specs.Mount, 0, len(ms))
	for _, m := range ms {
		opts := []string{"rbind", "rprivate", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: opts})
	}
	return out
}

func ptr[T any](v T) *T { return &v }

package oci

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/runtime"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func baseSpec() runtime.Spec {
	return runtime.Spec{
		ID:        "sb1",
		BundleDir: "/var/lib/berth/sandboxes/sb1",
		RootFS:    "/var/lib/berth/sandboxes/sb1/rootfs",
		Args:      []string{"/.berth/berth-agent"},
		Env:       []string{"LANG=C.UTF-8"},
		Mounts: []runtime.Mount{
			{Source: "/usr/lib/berth/berth-agent", Target: "/.berth/berth-agent", ReadOnly: true},
			{Source: "/var/lib/berth/sandboxes/sb1/run", Target: "/run/berth"},
		},
		Resources: runtime.Resources{CPUMillis: 1500, MemoryBytes: 512 << 20, Pids: 256},
	}
}

func TestGenerateSpecGolden(t *testing.T) {
	withNetns := baseSpec()
	withNetns.NetNSPath = "/run/netns/berth-sb1"
	withNetns.Hostname = "box"
	withNetns.Cwd = "/home/user"
	withNetns.Env = []string{"PATH=/bin", "HOME=/home/user"}
	unlimited := baseSpec()
	unlimited.Resources = runtime.Resources{}
	userns := withNetns
	userns.UserNS = &runtime.IDMap{HostID: 2000000000, Size: 65536}
	usernsNoNet := baseSpec()
	usernsNoNet.UserNS = userns.UserNS
	tests := []struct {
		name    string
		spec    runtime.Spec
		backend string
	}{
		{"runc", baseSpec(), Runc},
		{"runsc", baseSpec(), Runsc},
		{"runc-netns", withNetns, Runc},
		{"runsc-netns", withNetns, Runsc},
		{"runc-unlimited", unlimited, Runc},
		{"runc-userns-netns", userns, Runc}, // /sys: a bind of the sysfs berth mounts in the netns
		{"runc-userns", usernsNoNet, Runc},  // /sys: the sandbox's own sysfs
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := GenerateSpec(tt.spec, tt.backend)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(spec, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", tt.name+".json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("config.json differs from %s (-want +got):\n%s", golden, d)
			}
		})
	}
}

func TestGenerateSpecRejects(t *testing.T) {
	mod := func(f func(*runtime.Spec)) runtime.Spec { s := baseSpec(); f(&s); return s }
	tests := []struct {
		name    string
		spec    runtime.Spec
		backend string
		field   string
	}{
		{"backend", baseSpec(), "crun", "runtime"},
		{"id", mod(func(s *runtime.Spec) { s.ID = "Bad/ID" }), Runc, "id"},
		{"rootfs", mod(func(s *runtime.Spec) { s.RootFS = "rootfs" }), Runc, "rootfs"},
		{"bundle", mod(func(s *runtime.Spec) { s.BundleDir = "" }), Runc, "bundle_dir"},
		{"args", mod(func(s *runtime.Spec) { s.Args = nil }), Runc, "args"},
		{"cwd", mod(func(s *runtime.Spec) { s.Cwd = "home" }), Runc, "cwd"},
		{"netns", mod(func(s *runtime.Spec) { s.NetNSPath = "netns" }), Runsc, "netns_path"},
		{"mount", mod(func(s *runtime.Spec) { s.Mounts[0].Target = "x" }), Runc, "mounts"},
		{"negative", mod(func(s *runtime.Spec) { s.Resources.Pids = -1 }), Runc, "resources"},
		{"tiny memory", mod(func(s *runtime.Spec) { s.Resources.MemoryBytes = 1024 }), Runc, "resources"},
		{"userns on runsc", mod(func(s *runtime.Spec) { s.UserNS = &runtime.IDMap{HostID: 100000, Size: 65536} }), Runsc, "user_ns"},
		{"userns to host root", mod(func(s *runtime.Spec) { s.UserNS = &runtime.IDMap{HostID: 0, Size: 65536} }), Runc, "user_ns"},
		{"userns overflow", mod(func(s *runtime.Spec) { s.UserNS = &runtime.IDMap{HostID: 1<<32 - 10, Size: 65536} }), Runc, "user_ns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := GenerateSpec(tt.spec, tt.backend)
			if errs.KindOf(err) != errs.InvalidArgument || errs.FieldOf(err) != tt.field {
				t.Fatalf("GenerateSpec: err = %v (kind %v, field %q), want invalid_argument on %q", err, errs.KindOf(err), errs.FieldOf(err), tt.field)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	tests := map[string]errs.Kind{
		`container "x" does not exist`:                 errs.NotFound,
		"loading container: file does not exist":       errs.NotFound,
		"container with id exists: x":                  errs.Internal,
		`container with given ID already exists`:       errs.AlreadyExists,
		"cannot kill container: container not running": errs.FailedPrecondition,
		"container not paused":                         errs.FailedPrecondition,
		"criu failed: type NOTIFY errno 0":             errs.Internal,
	}
	for msg, want := range tests {
		if got := classify(msg); got != want {
			t.Errorf("classify(%q) = %v, want %v", msg, got, want)
		}
	}
}

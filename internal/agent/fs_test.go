package agent_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentapi"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/google/go-cmp/cmp"
)

// brief is the part of an EntryInfo these tests pin down.
type brief struct {
	Path, Type, Target, Owner string
}

func briefs(list []agentapi.EntryInfo) []brief {
	var out []brief
	for _, e := range list {
		out = append(out, brief{e.Path, e.Type, e.SymlinkTarget, e.Owner})
	}
	return out
}

// tree builds home/d: f1, sub/f2, sub/deeper/f3, link -> sub, dangling -> nowhere.
func tree(t *testing.T, e *env) string {
	d := filepath.Join(e.home, "d")
	writeFile(t, filepath.Join(d, "f1"), "1")
	writeFile(t, filepath.Join(d, "sub", "f2"), "22")
	writeFile(t, filepath.Join(d, "sub", "deeper", "f3"), "333")
	if err := os.Symlink("sub", filepath.Join(d, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(d, "nowhere"), filepath.Join(d, "dangling")); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestList(t *testing.T) {
	e := newEnv(t)
	d := tree(t, e)
	level1 := []brief{
		{d + "/dangling", "", d + "/nowhere", "root"},
		{d + "/f1", "file", "", "root"},
		{d + "/link", "dir", d + "/sub", "root"},
		{d + "/sub", "dir", "", "root"},
	}
	level2 := []brief{
		level1[0], level1[1], level1[2], level1[3],
		{d + "/sub/deeper", "dir", "", "root"},
		{d + "/sub/f2", "file", "", "root"},
	}
	tests := []struct {
		name  string
		req   agentapi.ListRequest
		want  []brief
		kind  errs.Kind
		words string
	}{
		{"depth 0 means 1", agentapi.ListRequest{Path: "d"}, level1, 0, ""},
		{"depth 1", agentapi.ListRequest{Path: d, Depth: 1}, level1, 0, ""},
		{"depth 2 does not follow links", agentapi.ListRequest{Path: "~/d", Depth: 2}, level2, 0, ""},
		{"missing", agentapi.ListRequest{Path: "nope"}, nil, errs.NotFound, "nope"},
		{"not a directory", agentapi.ListRequest{Path: "d/f1"}, nil, errs.InvalidArgument, "not a directory"},
		{"negative depth", agentapi.ListRequest{Path: "d", Depth: -1}, nil, errs.InvalidArgument, "depth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.client.List(testCtx(t), tt.req)
			if tt.words != "" {
				wantErr(t, err, tt.kind, tt.words)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, briefs(got)); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestStat(t *testing.T) {
	e := newEnv(t)
	d := tree(t, e)
	before := time.Now().Add(-time.Minute)
	tests := []struct {
		path string
		want agentapi.EntryInfo
	}{
		{"d/f1", agentapi.EntryInfo{Name: "f1", Type: "file", Path: d + "/f1", Size: 1, Mode: 0o644, Permissions: "-rw-r--r--", Owner: "root", Group: "root"}},
		{"d/sub", agentapi.EntryInfo{Name: "sub", Type: "dir", Path: d + "/sub", Mode: 0o755, Permissions: "drwxr-xr-x", Owner: "root", Group: "root"}},
		{"d/link", agentapi.EntryInfo{Name: "link", Type: "dir", Path: d + "/link", Size: 3, Mode: 0o777, Permissions: "lrwxrwxrwx", Owner: "root", Group: "root", SymlinkTarget: d + "/sub"}},
		{"d/dangling", agentapi.EntryInfo{Name: "dangling", Type: "", Path: d + "/dangling", Size: int64(len(d + "/nowhere")), Mode: 0o777, Permissions: "lrwxrwxrwx", Owner: "root", Group: "root", SymlinkTarget: d + "/nowhere"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, err := e.client.Stat(testCtx(t), agentapi.PathRequest{Path: tt.path})
			if err != nil {
				t.Fatal(err)
			}
			if got.ModTime.Before(before) {
				t.Errorf("mod time %v", got.ModTime)
			}
			got.ModTime = time.Time{}
			if tt.want.Type == "dir" && tt.want.Permissions[0] == 'd' {
				tt.want.Size = got.Size // directory sizes are filesystem-specific
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
	_, err := e.client.Stat(testCtx(t), agentapi.PathRequest{Path: "missing"})
	wantErr(t, err, errs.NotFound, "missing")
}

func TestMkdirMoveRemove(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	info, err := e.client.Mkdir(ctx, agentapi.PathRequest{Path: "x/y/z"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != "dir" || info.Path != filepath.Join(e.home, "x/y/z") || info.Owner != "user" {
		t.Fatalf("mkdir entry = %+v", info)
	}
	for _, p := range []string{"x", "x/y", "x/y/z"} {
		if o := ownerOf(t, filepath.Join(e.home, p)); o != [2]uint32{nobody, nobody} {
			t.Errorf("%s owner = %v", p, o)
		}
	}
	writeFile(t, filepath.Join(e.home, "x/file"), "f")
	_, err = e.client.Mkdir(ctx, agentapi.PathRequest{Path: "x/y/z"})
	wantErr(t, err, errs.AlreadyExists, "already exists")
	_, err = e.client.Mkdir(ctx, agentapi.PathRequest{Path: "x/file"})
	wantErr(t, err, errs.InvalidArgument, "not a directory")
	_, err = e.client.Mkdir(ctx, agentapi.PathRequest{Path: "x/file/sub"})
	wantErr(t, err, errs.InvalidArgument, "not a directory")

	moved, err := e.client.Move(ctx, agentapi.MoveRequest{Source: "x/file", Destination: "new/parent/renamed"})
	if err != nil {
		t.Fatal(err)
	}
	if moved.Path != filepath.Join(e.home, "new/parent/renamed") || moved.Type != "file" || moved.Size != 1 {
		t.Fatalf("move entry = %+v", moved)
	}
	if o := ownerOf(t, filepath.Join(e.home, "new/parent")); o != [2]uint32{nobody, nobody} {
		t.Errorf("move-created parent owner = %v", o)
	}
	_, err = e.client.Move(ctx, agentapi.MoveRequest{Source: "x/file", Destination: "again"})
	wantErr(t, err, errs.NotFound, "x/file")

	if err := e.client.Remove(ctx, agentapi.PathRequest{Path: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.home, "x")); !os.IsNotExist(err) {
		t.Fatalf("x still there: %v", err)
	}
	if err := e.client.Remove(ctx, agentapi.PathRequest{Path: "never-existed"}); err != nil {
		t.Fatalf("remove of a missing path: %v", err)
	}
}

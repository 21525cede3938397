package merge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/safefs"
)

// Journal states, in order.
const (
	JournalPrepared   = "prepared"   // staging (or staged); the target untouched
	JournalCommitting = "committing" // renames in progress: roll back on recovery
	JournalCommitted  = "committed"  // done: only the staging dir is left to remove
	JournalRolledBack = "rolled-back"
)

// Journal records an apply so that an interrupted one can be rolled back.
// The caller keeps it where the sandbox cannot write (the daemon's data
// dir) and saves it, synced, every time Apply hands it over.
type Journal struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Staging string `json:"staging"` // directory beneath the target root
	Steps   []Step `json:"steps"`
}

// Step is one delete or write of the plan as staged: the new object waits
// at Staging/new/N, a replaced one is kept at Staging/old/N until commit.
type Step struct {
	Op     string       `json:"op"` // delete | write | meta
	Path   string       `json:"path"`
	N      int          `json:"n"`
	Node   fsdiff.Node  `json:"node"`
	Expect *fsdiff.Node `json:"expect,omitempty"`
}

// Sources are the views a plan's writes copy content From.
type Sources map[Side]*fsdiff.Tree

// ApplyOptions are the effects Apply leaves to its caller.
type ApplyOptions struct {
	// Save persists the journal (synced) before Apply goes on.
	Save func(*Journal) error
	// BeforeCommit runs once everything is staged, right before the first
	// rename: the daemon freezes the target and verifies the plan's
	// Expect nodes here (Verify); an error aborts with nothing changed.
	BeforeCommit func() error
	// AfterStep, if set, runs after each committed step with the number of
	// steps done: the daemon's test hook that holds a commit midway (an
	// e2e test kills the daemon there).
	AfterStep func(done int)
	// crashAfter (tests) stops the commit after that many steps, as a
	// kill -9 would, leaving the journal in committing.
	crashAfter int
}

var errCrash = errors.New("simulated crash")

// Apply applies a clean plan to the tree under root (a sandbox's rootfs as
// the host sees it, or any directory): it stages every new object in a
// directory beneath root, then commits with renames only, keeping what it
// replaces, so that Recover can undo an interrupted commit. Every path is
// resolved beneath root with no symlinks (safefs); nothing is followed.
func Apply(ctx context.Context, root string, p *Plan, src Sources, id string, o ApplyOptions) error {
	if !p.Clean() {
		return errs.E(errs.FailedPrecondition, "merge %s has %d unresolved conflict(s)", id, len(p.Conflicts))
	}
	r, err := safefs.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	j := NewJournal(p, id)
	// Journal first: a crash while staging leaves a staging dir that
	// Recover (state prepared) removes.
	if err := o.Save(j); err != nil {
		return err
	}
	if err := stage(ctx, r, j, p, src); err != nil {
		_ = os.RemoveAll(path.Join(root, j.Staging))
		return err
	}
	if o.BeforeCommit != nil {
		if err := o.BeforeCommit(); err != nil {
			_ = os.RemoveAll(path.Join(root, j.Staging))
			return err
		}
	}
	j.State = JournalCommitting
	if err := o.Save(j); err != nil {
		_ = os.RemoveAll(path.Join(root, j.Staging))
		return err
	}
	sd := openStagingDirs(r, j)
	defer sd.Close()
	for i, s := range j.Steps {
		if o.crashAfter > 0 && i == o.crashAfter {
			return errCrash
		}
		if err := commitStep(sd, j, s); err != nil {
			if rerr := rollback(r, j); rerr != nil {
				return errors.Join(err, rerr)
			}
			j.State = JournalRolledBack
			return errors.Join(err, o.Save(j))
		}
		if o.AfterStep != nil {
			o.AfterStep(i + 1)
		}
	}
	j.State = JournalCommitted
	if err := o.Save(j); err != nil {
		return err
	}
	return os.RemoveAll(path.Join(root, j.Staging))
}

// Recover finishes what an interrupted Apply left under root: a commit in
// progress is rolled back (the target is as it was before the merge), a
// finished one only loses its staging dir.
func Recover(root string, j *Journal) error {
	r, err := safefs.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if j.State == JournalCommitting {
		if err := rollback(r, j); err != nil {
			return err
		}
		j.State = JournalRolledBack
	}
	if j.Staging == "" || path.Base(j.Staging) != j.Staging {
		return errs.E(errs.Internal, "journal %s: bad staging name %q", j.ID, j.Staging)
	}
	return os.RemoveAll(path.Join(root, j.Staging))
}

// NewJournal is the journal of applying p as merge id: its steps in
// commit order (deletes, then writes), state prepared.
func NewJournal(p *Plan, id string) *Journal {
	j := &Journal{ID: id, State: JournalPrepared, Staging: ".berth-merge-" + id}
	for _, d := range p.Deletes {
		j.Steps = append(j.Steps, Step{Op: "delete", Path: d.Path, N: len(j.Steps), Expect: d.Expect})
	}
	for _, w := range p.Writes {
		op := "write"
		if w.MetaOnly || (w.Node.Type == fsdiff.TypeDir && w.Expect != nil && w.Expect.Type == fsdiff.TypeDir) {
			op = "meta"
		}
		j.Steps = append(j.Steps, Step{Op: op, Path: w.Path, N: len(j.Steps), Node: w.Node, Expect: w.Expect})
	}
	return j
}

func (s Step) newName(j *Journal) string { return j.Staging + "/new/" + strconv.Itoa(s.N) }
func (s Step) oldName(j *Journal) string { return j.Staging + "/old/" + strconv.Itoa(s.N) }

// stage makes the staging dir and every new object in it, owned and
// moded as it will be.
func stage(ctx context.Context, r *safefs.Root, j *Journal, p *Plan, src Sources) error {
	newDir, err := makeStaging(r, j)
	if err != nil {
		return err
	}
	defer newDir.Close()
	dfd := int(newDir.Fd())
	writes := map[string]Write{}
	for _, w := range p.Writes {
		writes[w.Path] = w
	}
	for _, s := range j.Steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.Op != "write" {
			continue
		}
		name := strconv.Itoa(s.N)
		switch s.Node.Type {
		case fsdiff.TypeDir:
			if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
		case fsdiff.TypeSymlink:
			if err := unix.Symlinkat(s.Node.Target, dfd, name); err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
			if err := unix.Fchownat(dfd, name, int(s.Node.UID), int(s.Node.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
			continue
		case fsdiff.TypeFile:
			if err := stageFile(dfd, name, writes[s.Path], src, s.Node); err != nil {
				return err
			}
			continue
		case fsdiff.TypeFIFO:
			if err := unix.Mkfifoat(dfd, name, 0o600); err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
		default:
			return errs.E(errs.PermissionDenied, "merge never creates a %s (%s)", s.Node.Type, s.Path)
		}
		if err := setMeta(r, s.newName(j), s.Node); err != nil {
			return err
		}
	}
	// One flush for everything staged (not an fsync per file): after a
	// power loss no commit may rename an unwritten file into place.
	if err := unix.Syncfs(dfd); err != nil {
		return errs.Wrap(errs.Internal, err, "sync staged files")
	}
	return nil
}

// stageFile creates name in the staging dir dfd with w's content and
// gives it n's owner, then mode (chown clears setuid), through its own
// descriptor.
func stageFile(dfd int, name string, w Write, src Sources, n fsdiff.Node) error {
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "stage %s", w.Path)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	switch {
	case w.Content != nil:
		_, err = f.Write(w.Content)
	case w.From != "":
		t := src[w.From]
		if t == nil {
			return errs.E(errs.FailedPrecondition, "write of %s needs the %s view", w.Path, w.From)
		}
		var in io.ReadCloser
		in, _, err = t.Open(w.Path)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, in)
		in.Close()
	}
	if err == nil {
		err = unix.Fchown(fd, int(n.UID), int(n.GID))
	}
	if err == nil {
		err = unix.Fchmod(fd, n.Mode&0o7777)
	}
	if err != nil {
		return errs.Wrap(errs.Internal, err, "stage %s", w.Path)
	}
	return nil
}

// setMeta gives the object at rel (a file or directory, opened beneath r)
// its owner, then its mode: chown clears setuid bits.
func setMeta(r *safefs.Root, rel string, n fsdiff.Node) error {
	var f *os.File
	var err error
	if n.Type == fsdiff.TypeDir {
		f, err = r.OpenDir(rel)
	} else {
		f, err = r.Open(rel)
	}
	if err != nil {
		if n.Type == fsdiff.TypeFIFO {
			return nil // never opened; its mode came with mkfifo
		}
		return err
	}
	defer f.Close()
	if err := f.Chown(int(n.UID), int(n.GID)); err != nil {
		return errs.Wrap(errs.Internal, err, "chown %s", rel)
	}
	if err := unix.Fchmod(int(f.Fd()), n.Mode&0o7777); err != nil {
		return errs.Wrap(errs.Internal, err, "chmod %s", rel)
	}
	return nil
}

// rename moves from to to, both beneath r, through their parent dirs
// opened without symlinks.
func rename(r *safefs.Root, from, to string) error {
	fd, err := r.OpenDir(path.Dir(from))
	if err != nil {
		return err
	}
	defer fd.Close()
	td, err := r.OpenDir(path.Dir(to))
	if err != nil {
		return err
	}
	defer td.Close()
	if err := unix.Renameat(int(fd.Fd()), path.Base(from), int(td.Fd()), path.Base(to)); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

func (s Step) isDir() bool { return s.Expect != nil && s.Expect.Type == fsdiff.TypeDir }

func rmdir(r *safefs.Root, rel string) error {
	d, err := r.OpenDir(path.Dir(rel))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Unlinkat(int(d.Fd()), path.Base(rel), unix.AT_REMOVEDIR); err != nil {
		return &os.PathError{Op: "rmdir", Path: rel, Err: err}
	}
	return nil
}

func mkdir(r *safefs.Root, rel string, n fsdiff.Node) error {
	d, err := r.OpenDir(path.Dir(rel))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Mkdirat(int(d.Fd()), path.Base(rel), 0o700); err != nil {
		return &os.PathError{Op: "mkdir", Path: rel, Err: err}
	}
	return setMeta(r, rel, n)
}

func exists(r *safefs.Root, rel string) (bool, error) {
	_, err := r.Lstat(rel)
	if errs.Is(err, errs.NotFound) {
		return false, nil
	}
	return err == nil, err
}

// stagingDirs holds a commit's staging dirs (new/, old/) open: every
// write step renames out of one and often into the other, and reopening
// them beneath the root per step is a path walk each (slow in gVisor).
// Target parents are opened per step, as the plan names them.
type stagingDirs struct {
	r   *safefs.Root
	fds map[string]*os.File
}

func openStagingDirs(r *safefs.Root, j *Journal) *stagingDirs {
	d := &stagingDirs{r: r, fds: map[string]*os.File{}}
	for _, name := range []string{j.Staging + "/new", j.Staging + "/old"} {
		if f, err := r.OpenDir(name); err == nil {
			d.fds[name] = f
		}
	}
	return d
}

func (d *stagingDirs) Close() {
	for _, f := range d.fds {
		_ = f.Close()
	}
}

// dir opens rel beneath the root, or lends a held staging dir (done is
// then a no-op).
func (d *stagingDirs) dir(rel string) (f *os.File, done func(), err error) {
	if f, ok := d.fds[rel]; ok {
		return f, func() {}, nil
	}
	f, err = d.r.OpenDir(rel)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { _ = f.Close() }, nil
}

// rename is rename beneath the root through d.
func (d *stagingDirs) rename(from, to string) error {
	fd, fdone, err := d.dir(path.Dir(from))
	if err != nil {
		return err
	}
	defer fdone()
	td, tdone, err := d.dir(path.Dir(to))
	if err != nil {
		return err
	}
	defer tdone()
	if err := unix.Renameat(int(fd.Fd()), path.Base(from), int(td.Fd()), path.Base(to)); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

func commitStep(d *stagingDirs, j *Journal, s Step) error {
	r := d.r
	switch s.Op {
	case "meta":
		return setMeta(r, s.Path, s.Node)
	case "delete":
		if s.isDir() {
			// A directory from a lower layer cannot be renamed on overlayfs
			// (redirect_dir=off): its entries went first, remove it and
			// make it again on rollback.
			return rmdir(r, s.Path)
		}
		return d.rename(s.Path, s.oldName(j))
	}
	there, err := exists(r, s.Path)
	if err != nil {
		return err
	}
	if there {
		if err := d.rename(s.Path, s.oldName(j)); err != nil {
			return err
		}
	}
	return d.rename(s.newName(j), s.Path)
}

// rollback undoes committed steps in reverse. A step's new object has been
// placed if its staged name is gone; what it replaced waits at old/N.
func rollback(r *safefs.Root, j *Journal) error {
	var errList []error
	for i := len(j.Steps) - 1; i >= 0; i-- {
		s := j.Steps[i]
		if s.Op == "meta" {
			if s.Expect != nil {
				if ok, _ := exists(r, s.Path); ok {
					errList = append(errList, setMeta(r, s.Path, *s.Expect))
				}
			}
			continue
		}
		if s.Op == "delete" && s.isDir() {
			if ok, err := exists(r, s.Path); err != nil {
				errList = append(errList, err)
			} else if !ok {
				errList = append(errList, mkdir(r, s.Path, *s.Expect))
			}
			continue
		}
		if s.Op == "write" {
			staged, err := exists(r, s.newName(j))
			if err != nil {
				errList = append(errList, err)
				continue
			}
			if !staged { // placed: take it out again, back into staging
				if err := rename(r, s.Path, s.newName(j)); err != nil && !errs.Is(err, errs.NotFound) {
					errList = append(errList, fmt.Errorf("undo write %s: %w", s.Path, err))
					continue
				}
			}
		}
		if kept, err := exists(r, s.oldName(j)); err != nil {
			errList = append(errList, err)
		} else if kept {
			if err := rename(r, s.oldName(j), s.Path); err != nil {
				errList = append(errList, fmt.Errorf("restore %s: %w", s.Path, err))
			}
		}
	}
	return errors.Join(errList...)
}

// Verify checks, with the target frozen, that ours is still what the plan
// was computed against: every step's Expect node (kind, mode, owner,
// content digest). A mismatch is Conflict: plan again.
func Verify(p *Plan, ours *fsdiff.Tree) error {
	check := func(rel string, want *fsdiff.Node) error {
		n, ok, err := ours.Lookup(rel)
		if err != nil {
			return err
		}
		if want == nil {
			if ok {
				return errs.E(errs.Conflict, "%s appeared in the target since the merge was planned", rel)
			}
			return nil
		}
		if !ok {
			return errs.E(errs.Conflict, "%s went away in the target since the merge was planned", rel)
		}
		w := *want
		if n.Type == fsdiff.TypeFile && w.SHA256 != "" {
			if n.SHA256, err = ours.Hash(rel); err != nil {
				return err
			}
		} else { // no digest recorded: compare kind and metadata only
			n.SHA256, w.SHA256 = "-", "-"
		}
		if !same(&n, &w) {
			return errs.E(errs.Conflict, "%s changed in the target since the merge was planned", rel)
		}
		return nil
	}
	for _, d := range p.Deletes {
		if err := check(d.Path, d.Expect); err != nil {
			return err
		}
	}
	for _, w := range p.Writes {
		if err := check(w.Path, w.Expect); err != nil {
			return err
		}
	}
	return nil
}

// makeStaging makes the journal's staging dir with its new/ and old/
// (0700, beneath r: the target is a sandbox's tree) and opens new/.
func makeStaging(r *safefs.Root, j *Journal) (*os.File, error) {
	top, err := r.OpenDir(".")
	if err != nil {
		return nil, err
	}
	defer top.Close()
	for _, d := range []string{j.Staging, j.Staging + "/new", j.Staging + "/old"} {
		if err := unix.Mkdirat(int(top.Fd()), d, 0o700); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "make staging dir %s", d)
		}
	}
	return r.OpenDir(j.Staging + "/new")
}

package merge

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/fsdiff"
	"github.com/berth-dev/berth/internal/safefs"
)

// Remote apply: where the target's tree cannot be written from the host
// (a runsc sandbox keeps its writes in the sentry), the host writes the
// staged objects as a tar (WriteStage) and the agent inside the sandbox
// stages (StageFromTar) and commits (Commit) them beneath "/", with the
// same renames and rollback as Apply. The journal stays with the host.

// WriteStage writes the new objects of j's write steps as a tar: one entry
// per step, named by its number (the content of a file from the plan or
// its From view; a directory; a symlink).
func WriteStage(ctx context.Context, w io.Writer, j *Journal, p *Plan, src Sources) error {
	writes := map[string]Write{}
	for _, wr := range p.Writes {
		writes[wr.Path] = wr
	}
	tw := tar.NewWriter(w)
	for _, s := range j.Steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.Op != "write" {
			continue
		}
		hdr := &tar.Header{Name: strconv.Itoa(s.N), Mode: int64(s.Node.Mode & 0o7777), Uid: int(s.Node.UID), Gid: int(s.Node.GID)}
		switch s.Node.Type {
		case fsdiff.TypeDir:
			hdr.Typeflag = tar.TypeDir
		case fsdiff.TypeSymlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, s.Node.Target
		case fsdiff.TypeFIFO:
			hdr.Typeflag = tar.TypeFifo
		case fsdiff.TypeFile:
			hdr.Typeflag = tar.TypeReg
			wr := writes[s.Path]
			var in io.Reader
			switch {
			case wr.Content != nil:
				hdr.Size = int64(len(wr.Content))
				in = bytesReader(wr.Content)
			case wr.From != "":
				t := src[wr.From]
				if t == nil {
					return errs.E(errs.FailedPrecondition, "write of %s needs the %s view", s.Path, wr.From)
				}
				rc, n, err := t.Open(s.Path)
				if err != nil {
					return err
				}
				hdr.Size, in = n.Size, rc
			default:
				in = bytesReader(nil)
			}
			n, err := int64(0), tw.WriteHeader(hdr)
			if err == nil {
				n, err = io.Copy(tw, io.LimitReader(in, hdr.Size))
			}
			if c, ok := in.(io.Closer); ok {
				_ = c.Close() // one open source file at a time, not one per step
			}
			if err != nil || n != hdr.Size {
				return errs.E(errs.Internal, "stage %s: %d of %d bytes (%v)", s.Path, n, hdr.Size, err)
			}
			continue
		default:
			return errs.E(errs.PermissionDenied, "merge never creates a %s (%s)", s.Node.Type, s.Path)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
		}
	}
	return tw.Close()
}

type byteReader struct {
	b []byte
}

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func bytesReader(b []byte) io.Reader { return &byteReader{b: b} }

// StageOptions tune StageFromTar.
type StageOptions struct {
	// NoSync leaves out the syncfs of the staged files: the caller makes
	// them durable another way before the commit (inside gVisor a syncfs
	// fsyncs every file the sentry has open, one host fsync each; with
	// --overlay2=none the data is already in the host's upper, where the
	// host syncs it with one syncfs).
	NoSync bool
}

// StageFromTar makes j's staging dir beneath root and fills Staging/new
// from a WriteStage tar: every entry must be a write step of j of the
// type the step says; owners and modes are the step's. A staging dir of
// an earlier try is removed first, so the call can be repeated.
func StageFromTar(ctx context.Context, root string, j *Journal, r io.Reader, o StageOptions) error {
	if j.Staging == "" || path.Base(j.Staging) != j.Staging {
		return errs.E(errs.InvalidArgument, "journal %s: bad staging name %q", j.ID, j.Staging)
	}
	sr, err := safefs.OpenRoot(root)
	if err != nil {
		return err
	}
	defer sr.Close()
	_ = os.RemoveAll(path.Join(root, j.Staging))
	newDir, err := makeStaging(sr, j)
	if err != nil {
		return err
	}
	defer newDir.Close()
	dfd := int(newDir.Fd())
	want := map[string]Step{}
	for _, s := range j.Steps {
		if s.Op == "write" {
			want[strconv.Itoa(s.N)] = s
		}
	}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, err, "staging tar")
		}
		s, ok := want[hdr.Name]
		if !ok {
			return errs.E(errs.InvalidArgument, "staging tar: %q is no write step of merge %s", hdr.Name, j.ID)
		}
		delete(want, hdr.Name)
		name := hdr.Name
		switch {
		case s.Node.Type == fsdiff.TypeDir && hdr.Typeflag == tar.TypeDir:
			err = unix.Mkdirat(dfd, name, 0o700)
		case s.Node.Type == fsdiff.TypeSymlink && hdr.Typeflag == tar.TypeSymlink:
			if err = unix.Symlinkat(s.Node.Target, dfd, name); err == nil {
				err = unix.Fchownat(dfd, name, int(s.Node.UID), int(s.Node.GID), unix.AT_SYMLINK_NOFOLLOW)
			}
			if err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
			continue
		case s.Node.Type == fsdiff.TypeFIFO && hdr.Typeflag == tar.TypeFifo:
			err = unix.Mkfifoat(dfd, name, 0o600)
		case s.Node.Type == fsdiff.TypeFile && hdr.Typeflag == tar.TypeReg:
			// Owner and mode are set on the new file's own descriptor
			// (no second walk to it).
			if err = stageStream(dfd, name, tr, hdr.Size, s.Node); err != nil {
				return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
			}
			continue
		default:
			return errs.E(errs.InvalidArgument, "staging tar: entry %s of type %c for a %s", name, hdr.Typeflag, s.Node.Type)
		}
		if err != nil {
			return errs.Wrap(errs.Internal, err, "stage %s", s.Path)
		}
		if err := setMeta(sr, j.Staging+"/new/"+name, s.Node); err != nil {
			return err
		}
	}
	if len(want) > 0 {
		return errs.E(errs.InvalidArgument, "staging tar of merge %s lacks %d write step(s)", j.ID, len(want))
	}
	if o.NoSync {
		return nil
	}
	if err := unix.Syncfs(dfd); err != nil {
		return errs.Wrap(errs.Internal, err, "sync staged files")
	}
	return nil
}

// stageStream creates name (exclusively, in the staging dir dfd), copies
// size bytes of r into it and gives it n's owner, then mode (chown clears
// setuid), through its descriptor.
func stageStream(dfd int, name string, r io.Reader, size int64, n fsdiff.Node) error {
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if c, err := io.Copy(f, io.LimitReader(r, size)); err != nil || c != size {
		return errors.Join(err, errs.E(errs.Internal, "%d of %d bytes", c, size))
	}
	if err := unix.Fchown(fd, int(n.UID), int(n.GID)); err != nil {
		return err
	}
	return unix.Fchmod(fd, n.Mode&0o7777)
}

// Commit runs j's steps beneath root, as Apply does once staged (the
// caller has stopped the tree's writers and saved j as committing). A
// failed step rolls back what was done: rolledBack says the tree is as it
// was; false with an error means the rollback failed too (Recover later).
// afterStep, if set, runs after each step.
func Commit(root string, j *Journal, afterStep func(done int)) (rolledBack bool, err error) {
	r, err := safefs.OpenRoot(root)
	if err != nil {
		return true, err
	}
	defer r.Close()
	sd := openStagingDirs(r, j)
	defer sd.Close()
	for i, s := range j.Steps {
		if err := commitStep(sd, j, s); err != nil {
			if rerr := rollback(r, j); rerr != nil {
				return false, errors.Join(err, rerr)
			}
			return true, err
		}
		if afterStep != nil {
			afterStep(i + 1)
		}
	}
	return false, nil
}

package agent

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// DefaultUser is the user requests run as when they name none, if it exists.
const DefaultUser = "user"

// account is one resolved /etc/passwd entry plus its groups.
type account struct {
	Name   string
	UID    int
	GID    int
	Home   string
	Groups []int // supplementary groups, primary included
}

type passwdEntry struct {
	name string
	uid  int
	gid  int
	home string
}

type groupEntry struct {
	name    string
	gid     int
	members []string
}

// userDB is a parsed snapshot of passwd and group. It is re-read per request
// so that users added inside the sandbox are seen without a restart; no cgo.
type userDB struct {
	users  []passwdEntry
	groups []groupEntry
}

func readUserDB(passwdPath, groupPath string) (*userDB, error) {
	db := &userDB{}
	err := scanColonFile(passwdPath, func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return
		}
		db.users = append(db.users, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, errs.Wrap(errs.Internal, err, "read %s", passwdPath)
	}
	err = scanColonFile(groupPath, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, err := strconv.Atoi(f[2])
		if err != nil {
			return
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		db.groups = append(db.groups, groupEntry{name: f[0], gid: gid, members: members})
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, errs.Wrap(errs.Internal, err, "read %s", groupPath)
	}
	return db, nil
}

func scanColonFile(path string, fn func([]string)) error {
	b, err := readSmallFile(path)
	if err != nil {
		return err
	}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		s := strings.TrimSpace(string(line))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		fn(strings.Split(s, ":"))
	}
	return nil
}

// lookup resolves a request's user name: "" means DefaultUser if it exists,
// else root. An unknown name is Unauthenticated, as envd answers it.
func (db *userDB) lookup(name string) (account, error) {
	if name == "" {
		if a, ok := db.find(DefaultUser); ok {
			return a, nil
		}
		if a, ok := db.find("root"); ok {
			return a, nil
		}
		return account{Name: "root", UID: 0, GID: 0, Home: "/root", Groups: []int{0}}, nil
	}
	if a, ok := db.find(name); ok {
		return a, nil
	}
	return account{}, &errs.Error{Kind: errs.Unauthenticated, Field: "user", Message: "unknown user " + strconv.Quote(name)}
}

func (db *userDB) find(name string) (account, bool) {
	for _, u := range db.users {
		if u.name != name {
			continue
		}
		a := account{Name: u.name, UID: u.uid, GID: u.gid, Home: u.home, Groups: []int{u.gid}}
		if a.Home == "" {
			a.Home = "/"
		}
		for _, g := range db.groups {
			if g.gid == u.gid {
				continue
			}
			for _, m := range g.members {
				if m == name {
					a.Groups = append(a.Groups, g.gid)
					break
				}
			}
		}
		return a, true
	}
	return account{}, false
}

// userName maps a uid to its name, or the number when it has none.
func (db *userDB) userName(uid int) string {
	for _, u := range db.users {
		if u.uid == uid {
			return u.name
		}
	}
	return strconv.Itoa(uid)
}

// groupName maps a gid to its name, or the number when it has none.
func (db *userDB) groupName(gid int) string {
	for _, g := range db.groups {
		if g.gid == gid {
			return g.name
		}
	}
	return strconv.Itoa(gid)
}

// resolvePath applies e2b-protocol §9.2: empty → home, "~" and "~/x" → the
// user's home, relative → joined to the home, then cleaned.
func resolvePath(a account, p string) string {
	switch {
	case p == "" || p == "~":
		return filepath.Clean(a.Home)
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(a.Home, p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	default:
		return filepath.Join(a.Home, p)
	}
}

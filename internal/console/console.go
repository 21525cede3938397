// Package console owns berth's web console, served by `berth serve` at /ui:
// the embedded assets (plain HTML, CSS and ES modules, no build step), the
// sign-in sessions that exchange an API key for a session cookie, and the
// decision whether a /v1 request carrying that cookie may act (CSRF and
// origin checks). The console calls the ordinary /v1 API; owner scoping is
// the API's, unchanged: a session acts with exactly its key's rights.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/auth"
	"github.com/berth-dev/berth/internal/errs"
)

// Core is what the console needs from the daemon: to check an API key.
type Core interface {
	Authenticate(ctx context.Context, key string) (auth.Principal, error)
}

// Names shared with the browser code (assets/app.js) and the REST auth.
const (
	CookieName = "berth_session"
	CSRFHeader = "X-Berth-CSRF"
)

// Config bounds the sessions.
type Config struct {
	TTL         time.Duration    // a session's absolute lifetime (default 8h)
	MaxSessions int              // sessions held at once (default 10000); the oldest goes first
	Now         func() time.Time // injected clock
}

func (c *Config) setDefaults() {
	if c.TTL <= 0 {
		c.TTL = 8 * time.Hour
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 10000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Service holds the sessions. Its lock is a leaf: nothing else is taken
// while it is held.
type Service struct {
	core Core
	cfg  Config

	mu       sync.Mutex
	sessions map[string]*session // by cookie value
	signIns  uint64              // sessions signed in so far (session.seq)
}

type session struct {
	key     string // the API key it was made from, re-checked on every request
	csrf    string
	owner   string
	admin   bool
	expires time.Time
	seq     uint64 // sign-in order: the oldest of sessions expiring at once goes first
}

// Session is what the browser learns about its session (never the key).
type Session struct {
	Owner     string    `json:"owner"`
	Admin     bool      `json:"admin"`
	CSRF      string    `json:"csrf"`
	ExpiresAt time.Time `json:"expires_at"`
}

// New builds the console service.
func New(core Core, cfg Config) *Service {
	cfg.setDefaults()
	return &Service{core: core, cfg: cfg, sessions: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}

// SignIn exchanges an API key for a new session; it returns the cookie value.
func (s *Service) SignIn(ctx context.Context, key string) (string, Session, error) {
	if key == "" {
		return "", Session{}, errs.Field("api_key", "must be set")
	}
	p, err := s.core.Authenticate(ctx, key)
	if err != nil {
		return "", Session{}, err
	}
	now := s.cfg.Now()
	id := randomToken()
	se := &session{key: key, csrf: randomToken(), owner: p.Owner, admin: p.Admin, expires: now.Add(s.cfg.TTL)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signIns++
	se.seq = s.signIns
	s.sweepLocked(now)
	if len(s.sessions) >= s.cfg.MaxSessions {
		s.evictOldestLocked()
	}
	s.sessions[id] = se
	return id, se.view(), nil
}

func (se *session) view() Session {
	return Session{Owner: se.owner, Admin: se.admin, CSRF: se.csrf, ExpiresAt: se.expires}
}

func (s *Service) sweepLocked(now time.Time) {
	for id, se := range s.sessions {
		if !now.Before(se.expires) {
			delete(s.sessions, id)
		}
	}
}

func (s *Service) evictOldestLocked() {
	var oldest string
	var o *session
	for id, se := range s.sessions {
		if o == nil || se.expires.Before(o.expires) || (se.expires.Equal(o.expires) && se.seq < o.seq) {
			oldest, o = id, se
		}
	}
	delete(s.sessions, oldest)
}

// lookup returns a live session by cookie value.
func (s *Service) lookup(id string) (*session, bool) {
	if id == "" {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.sessions[id]
	if !ok {
		return nil, false
	}
	if !s.cfg.Now().Before(se.expires) {
		delete(s.sessions, id)
		return nil, false
	}
	return se, true
}

// SignOut deletes a session; signing out of an unknown session is a no-op.
func (s *Service) SignOut(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, id)
}

// Sessions is how many sessions are live (for tests and metrics).
func (s *Service) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(s.cfg.Now())
	return len(s.sessions)
}

func tokensEqual(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

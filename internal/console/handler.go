package console

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/httpx"
)

// The console is plain HTML, CSS and ES modules written for berth and
// embedded as they are: no build step, no vendored code, nothing fetched
// at run time.
//
//go:embed assets
var assets embed.FS

// Prefix is where berth serve mounts the console.
const Prefix = "/ui"

// signInRequest is the body of POST /ui/session.
type signInRequest struct {
	APIKey string `json:"api_key"`
}

// Handler serves /ui: the assets, and /ui/session (POST signs in with an API
// key, GET says who the session is and repeats its CSRF token after a page
// reload, DELETE signs out).
func (s *Service) Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	files := http.StripPrefix(Prefix+"/", http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("POST "+Prefix+"/session", s.signIn)
	mux.HandleFunc("GET "+Prefix+"/session", s.current)
	mux.HandleFunc("DELETE "+Prefix+"/session", s.signOut)
	mux.HandleFunc("GET "+Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, errs.E(errs.NotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return securityHeaders(mux)
}

// securityHeaders: the console runs only its own scripts and styles, talks
// only to its own origin and cannot be framed.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

func (s *Service) signIn(w http.ResponseWriter, r *http.Request) {
	if err := CheckOrigin(requestOf(r)); err != nil {
		httpx.WriteError(w, err)
		return
	}
	var req signInRequest
	if err := httpx.Decode(r, &req); err != nil {
		httpx.WriteError(w, err)
		return
	}
	id, se, err := s.SignIn(r.Context(), req.APIKey)
	if err != nil {
		httpx.WriteError(w, err)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: id, Path: "/", Expires: se.ExpiresAt, MaxAge: int(s.cfg.TTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	httpx.WriteJSON(w, http.StatusOK, se)
}

func (s *Service) current(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(CookieName)
	var se *session
	ok := false
	if err == nil {
		se, ok = s.lookup(c.Value)
	}
	if !ok {
		httpx.WriteError(w, errs.E(errs.Unauthenticated, "not signed in"))
		return
	}
	if err := CheckOrigin(requestOf(r)); err != nil {
		httpx.WriteError(w, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, se.view())
}

func (s *Service) signOut(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(CookieName)
	if err == nil {
		if se, ok := s.lookup(c.Value); ok {
			if err := Check(requestOf(r), se.csrf); err != nil {
				httpx.WriteError(w, err)
				return
			}
			s.SignOut(c.Value)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.WriteHeader(http.StatusNoContent)
}

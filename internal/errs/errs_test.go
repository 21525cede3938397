package errs

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestKindSurvivesWrapping(t *testing.T) {
	for _, k := range Kinds() {
		err := fmt.Errorf("outer: %w", Wrap(k, errors.New("cause"), "middle"))
		if KindOf(err) != k || !Is(err, k) {
			t.Errorf("kind %v lost through wrapping: got %v", k, KindOf(err))
		}
		if back, ok := KindNamed(k.String()); !ok || back != k {
			t.Errorf("KindNamed(%q) = %v, %v", k.String(), back, ok)
		}
		if k.String() == "" || (k != Internal && k.String() == "internal") {
			t.Errorf("kind %d has no name", k)
		}
		// The innermost meaningful kind wins over every outer kind.
		for _, outer := range Kinds() {
			got := KindOf(Wrap(outer, fmt.Errorf("ctx: %w", E(k, "inner")), "outer"))
			want := k
			if k == Internal {
				want = outer
			}
			if got != want {
				t.Errorf("Wrap(%v, %v) = %v, want %v", outer, k, got, want)
			}
			// ... unless the outer layer reclassifies on purpose.
			if got := KindOf(Reclassify(outer, E(k, "inner"), "outer")); got != outer {
				t.Errorf("Reclassify(%v, %v) = %v, want %v", outer, k, got, outer)
			}
		}
	}
	if k, ok := KindNamed("bogus"); ok || k != Internal {
		t.Error("an unknown kind name must be Internal, false")
	}
	if KindOf(errors.New("plain")) != Internal {
		t.Error("an unclassified error must be Internal")
	}
	if Wrap(NotFound, nil, "x") != nil || Reclassify(NotFound, nil, "x") != nil || ReclassifyField("f", nil, "x") != nil {
		t.Error("Wrap/Reclassify(nil) must be nil")
	}
}

func TestKindOf(t *testing.T) {
	raw := &fs.PathError{Op: "write", Path: "/x", Err: errors.New("no space left on device")}
	full := &Error{Kind: ResourceExhausted, Message: "no space left on device", Err: raw}
	notFound := E(NotFound, "template python not found")
	for _, tc := range []struct {
		name  string
		err   error
		kind  Kind
		field string
	}{
		{"nil", nil, Internal, ""},
		{"plain", errors.New("x"), Internal, ""},
		{"raw under Internal", Wrap(Internal, raw, "write"), Internal, ""},
		{"raw under a kind", Wrap(Unavailable, raw, "dial"), Unavailable, ""},
		{"full disk under three Internal wraps", Wrap(Internal, fmt.Errorf("upload: %w", Wrap(Internal, Wrap(Internal, full, "agent"), "files")), "sandbox"), ResourceExhausted, ""},
		{"full disk under Unavailable", Wrap(Unavailable, full, "agent"), ResourceExhausted, ""},
		{"explicit Internal leaf under a kind", Wrap(Unavailable, E(Internal, "boom"), "agent"), Unavailable, ""},
		{"inner NotFound reclassified", Reclassify(FailedPrecondition, Wrap(Internal, notFound, "get"), "template of sandbox"), FailedPrecondition, ""},
		{"reclassified to Internal is final", Wrap(Unavailable, Reclassify(Internal, notFound, "hide"), "x"), Internal, ""},
		{"kind inside a reclassified layer wrapped again", Wrap(Internal, Reclassify(Conflict, full, "busy"), "outer"), Conflict, ""},
		{"field survives Wrap", Wrap(Internal, Field("ttl", "bad"), "outer"), InvalidArgument, "ttl"},
		{"field survives fmt and Wrap", fmt.Errorf("a: %w", Wrap(Unavailable, fmt.Errorf("b: %w", Field("memory", "low")), "c")), InvalidArgument, "memory"},
		{"outer field wins", &Error{Kind: InvalidArgument, Field: "spec", Err: Field("ttl", "bad")}, InvalidArgument, "spec"},
		{"reclassify hides the inner field", Reclassify(FailedPrecondition, Field("ttl", "bad"), "x"), FailedPrecondition, ""},
		{"ReclassifyField names its own", ReclassifyField("templateID", notFound, "unknown template"), InvalidArgument, "templateID"},
		{"join: first kinded branch", errors.Join(Wrap(Internal, raw, "a"), full, notFound), ResourceExhausted, ""},
		{"join under a kind", Wrap(Unavailable, errors.Join(raw, raw), "x"), Unavailable, ""},
		{"join inside kinds", Wrap(Internal, errors.Join(notFound, full), "x"), NotFound, ""},
		{"join: field of a later branch", errors.Join(raw, Field("cpu", "bad")), InvalidArgument, "cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KindOf(tc.err); got != tc.kind {
				t.Errorf("KindOf = %v, want %v", got, tc.kind)
			}
			if got := FieldOf(tc.err); got != tc.field {
				t.Errorf("FieldOf = %q, want %q", got, tc.field)
			}
		})
	}
}

func TestReclassifyKeepsChain(t *testing.T) {
	cause := errors.New("cause")
	err := Reclassify(FailedPrecondition, Wrap(NotFound, cause, "template python"), "create")
	if !errors.Is(err, cause) {
		t.Error("Reclassify must keep the chain for errors.Is")
	}
	if got := err.Error(); got != "create: template python: cause" {
		t.Errorf("message %q", got)
	}
	if got := ReclassifyField("templateID", cause, "unknown %q", "x").Error(); got != `templateID: unknown "x": cause` {
		t.Errorf("message %q", got)
	}
}

func TestFieldIsNamed(t *testing.T) {
	err := fmt.Errorf("create: %w", Field("memory", "must be at least %d MiB", 16))
	if FieldOf(err) != "memory" || KindOf(err) != InvalidArgument {
		t.Fatalf("FieldOf = %q, kind %v", FieldOf(err), KindOf(err))
	}
	if got := err.Error(); got != "create: memory: must be at least 16 MiB" {
		t.Errorf("message %q", got)
	}
	if FieldOf(Wrap(Internal, Field("ttl", "bad"), "outer")) != "ttl" {
		t.Error("field lost through Wrap")
	}
}

func TestHide(t *testing.T) {
	full := E(ResourceExhausted, "disk full")
	gone := E(NotFound, "layer x")
	for _, tc := range []struct {
		name string
		err  error
		want Kind
	}{
		{"hidden kind", Wrap(Internal, Hide(gone, Internal, NotFound, AlreadyExists), "delete sandbox"), Internal},
		{"other kinds pass", Wrap(Internal, Hide(full, Internal, NotFound), "delete sandbox"), ResourceExhausted},
		{"unclassified passes", Hide(errors.New("x"), Unavailable, NotFound), Internal},
		{"reclassified to a kind", Hide(gone, FailedPrecondition, NotFound), FailedPrecondition},
	} {
		if got := KindOf(tc.err); got != tc.want {
			t.Errorf("%s: KindOf = %v, want %v", tc.name, got, tc.want)
		}
	}
	if Hide(nil, Internal, NotFound) != nil {
		t.Error("Hide(nil) must be nil")
	}
	if err := Hide(gone, Internal, NotFound); err.Error() != gone.Error() || !errors.Is(err, gone) {
		t.Errorf("Hide must keep the message and chain: %v", err)
	}
}

func TestShort(t *testing.T) {
	if got := Short(E(Internal, "plain")); got != "plain" {
		t.Errorf("short error changed: %q", got)
	}
	long := "first line\n" + strings.Repeat("noise\n", 200) + "  Error: the cause\n" + strings.Repeat("x", 700)
	got := Short(errors.New(long))
	if !strings.HasPrefix(got, "first line\nError: the cause") || len(got) > 600+len("…") {
		t.Errorf("Short = %q", got)
	}
}

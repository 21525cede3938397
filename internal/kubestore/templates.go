package kubestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/lazyregexp"
	"github.com/berth-dev/berth/internal/sandbox"
	"github.com/berth-dev/berth/internal/store"
)

// A Template object's spec is the definition and its status the build;
// the two times berth keeps to the nanosecond (creationTimestamp has
// seconds, and is the object's, not the template's) are annotations.
const (
	annCreated = "berth.dev/created-at"
	annUpdated = "berth.dev/updated-at"
)

var (
	dnsNameRe    = lazyregexp.New(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	hashedNameRe = lazyregexp.New(`^h\.[0-9a-f]{40}$`)
)

// templateObjectName is the object name of template name: the name itself
// when it is a DNS subdomain (what kubectl users will mostly see), else
// "h." and a hash of it. A name that looks like a hash form is hashed too,
// so the mapping is one-to-one.
func templateObjectName(name string) string {
	if len(name) <= 200 && dnsNameRe.MatchString(name) && !hashedNameRe.MatchString(name) {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "h." + hex.EncodeToString(sum[:])[:40]
}

func templateToObject(t store.Template, base *berthv1.Template) *berthv1.Template {
	o := *base
	o.TypeMeta = kube.TypeMeta{APIVersion: berthv1.APIVersion, Kind: "Template"}
	o.Name = templateObjectName(t.Name)
	o.Annotations = map[string]string{}
	for k, v := range base.Annotations {
		o.Annotations[k] = v
	}
	o.Annotations[annCreated] = t.CreatedAt.UTC().Format(time.RFC3339Nano)
	o.Annotations[annUpdated] = t.UpdatedAt.UTC().Format(time.RFC3339Nano)
	r := t.Resources
	o.Spec = berthv1.TemplateSpec{Name: t.Name, Source: t.Source, StartCmd: t.StartCmd, Env: t.Env, Workdir: t.Workdir,
		User: t.User, Resources: berthv1.Resources{CPUMillis: int64(r.CPUMillis), MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB, Pids: r.Pids}}
	conds := slices.Clone(base.Status.Conditions)
	c := kube.Condition{Type: "Ready", Status: "False", Reason: camel(t.State), Message: t.Progress, LastTransitionTime: t.UpdatedAt.UTC()}
	switch t.State {
	case store.TemplateReady:
		c.Status = "True"
	case store.TemplateFailed:
		c.Message = t.Error
	}
	kube.SetCondition(&conds, c)
	o.Status = berthv1.TemplateStatus{State: t.State, Fingerprint: t.Fingerprint, Layers: t.Layers, Progress: t.Progress,
		Error: t.Error, Conditions: conds}
	return &o
}

func templateFromObject(o *berthv1.Template) (store.Template, error) {
	sp, st := o.Spec, o.Status
	t := store.Template{Name: sp.Name, Fingerprint: st.Fingerprint, Layers: st.Layers, StartCmd: sp.StartCmd, Env: sp.Env,
		Workdir: sp.Workdir, User: sp.User, State: st.State, Progress: st.Progress, Error: st.Error, Source: sp.Source,
		Resources: sandbox.Resources{CPUMillis: int(sp.Resources.CPUMillis), MemoryMiB: sp.Resources.MemoryMiB,
			DiskMiB: sp.Resources.DiskMiB, Pids: sp.Resources.Pids}}
	for _, a := range []struct {
		key string
		dst *time.Time
	}{{annCreated, &t.CreatedAt}, {annUpdated, &t.UpdatedAt}} {
		v, ok := o.Annotations[a.key]
		if !ok {
			if o.CreationTimestamp != nil { // made by hand (kubectl): the object's time
				*a.dst = o.CreationTimestamp.UTC()
			}
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return store.Template{}, errs.Wrap(errs.Internal, err, "kubernetes store: template %s: annotation %s", o.Name, a.key)
		}
		*a.dst = ts
	}
	return t, nil
}

// getTemplate reads the object of template name (NotFound also when the
// object holds another name).
func (s *Store) getTemplate(ctx context.Context, name string) (*berthv1.Template, error) {
	var o berthv1.Template
	err := s.kc.Get(ctx, berthv1.Templates, s.ns, templateObjectName(name), &o)
	if errs.Is(err, errs.NotFound) {
		return nil, errs.E(errs.NotFound, "template %s not found", name)
	}
	if err != nil {
		return nil, err
	}
	if o.Spec.Name != name { // returned with the error: PutTemplate must not overwrite it
		return &o, errs.E(errs.NotFound, "template %s not found", name)
	}
	return &o, nil
}

// PutTemplate is a read, then a create or a conditional replace (retried
// on a race): two calls, keeping CreatedAt from the stored object.
func (s *Store) PutTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	if t.Name == "" {
		return store.Template{}, errs.Field("name", "must not be empty")
	}
	switch t.State {
	case store.TemplateBuilding, store.TemplateReady, store.TemplateFailed:
	default:
		return store.Template{}, errs.Field("state", "must be one of %s, %s, %s; got %q",
			store.TemplateBuilding, store.TemplateReady, store.TemplateFailed, t.State)
	}
	now := s.now().UTC()
	if t.UpdatedAt.IsZero() {
		t.UpdatedAt = now
	}
	created := t.CreatedAt
	for {
		cur, err := s.getTemplate(ctx, t.Name)
		switch {
		case errs.Is(err, errs.NotFound):
			if cur != nil { // the object of another name holds ours (made by hand, or a hash collision)
				return store.Template{}, errs.E(errs.AlreadyExists, "template %s: object %s holds template %s", t.Name, cur.Name, cur.Spec.Name)
			}
			t.CreatedAt = created
			if t.CreatedAt.IsZero() {
				t.CreatedAt = now
			}
			err = s.kc.Create(ctx, berthv1.Templates, s.ns, templateToObject(t, &berthv1.Template{}), nil)
			if errs.Is(err, errs.AlreadyExists) {
				continue
			}
		case err == nil:
			old, derr := templateFromObject(cur)
			if derr != nil {
				return store.Template{}, derr
			}
			t.CreatedAt = old.CreatedAt
			o := templateToObject(t, cur)
			err = s.kc.Update(ctx, berthv1.Templates, s.ns, o.Name, o, nil)
			if errs.Is(err, errs.Conflict) || errs.Is(err, errs.NotFound) {
				continue
			}
		}
		if err != nil {
			return store.Template{}, err
		}
		t.CreatedAt, t.UpdatedAt = t.CreatedAt.UTC(), t.UpdatedAt.UTC()
		return t, nil
	}
}

// GetTemplate reads template name.
func (s *Store) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	o, err := s.getTemplate(ctx, name)
	if err != nil {
		return store.Template{}, err
	}
	return templateFromObject(o)
}

// ListTemplates lists every Template object (with a name) by name.
func (s *Store) ListTemplates(ctx context.Context) ([]store.Template, error) {
	var out []store.Template
	opts := kube.ListOptions{Limit: 500}
	for {
		var l berthv1.TemplateList
		if err := s.kc.List(ctx, berthv1.Templates, s.ns, opts, &l); err != nil {
			return nil, err
		}
		for i := range l.Items {
			if l.Items[i].Spec.Name == "" || templateObjectName(l.Items[i].Spec.Name) != l.Items[i].Name {
				continue // not one of the store's
			}
			t, err := templateFromObject(&l.Items[i])
			if err != nil {
				return nil, err
			}
			out = append(out, t)
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	slices.SortFunc(out, func(a, b store.Template) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteTemplate deletes template name's object.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	err := s.kc.Delete(ctx, berthv1.Templates, s.ns, templateObjectName(name), kube.DeleteOptions{})
	if errs.Is(err, errs.NotFound) {
		return errs.E(errs.NotFound, "template %s not found", name)
	}
	return err
}

package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
)

// kinds maps the kinds berth's manifests use to their collections.
var kinds = map[string]kube.Resource{
	"CustomResourceDefinition": kube.CRDs,
	"Namespace":                kube.Namespaces,
	"Secret":                   kube.Secrets,
	"ServiceAccount":           {Version: "v1", Plural: "serviceaccounts", Namespaced: true},
	"Service":                  {Version: "v1", Plural: "services", Namespaced: true},
	"ConfigMap":                {Version: "v1", Plural: "configmaps", Namespaced: true},
	"ClusterRole":              {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "clusterroles"},
	"ClusterRoleBinding":       {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "clusterrolebindings"},
	"Role":                     {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "roles", Namespaced: true},
	"RoleBinding":              {Group: "rbac.authorization.k8s.io", Version: "v1", Plural: "rolebindings", Namespaced: true},
	"Deployment":               {Group: "apps", Version: "v1", Plural: "deployments", Namespaced: true},
	"DaemonSet":                {Group: "apps", Version: "v1", Plural: "daemonsets", Namespaced: true},
}

// Objects reads every YAML document of the files (sorted by name) in dir,
// or of one file.
func Objects(path string) ([]map[string]any, error) {
	files := []string{path}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		m, _ := filepath.Glob(filepath.Join(path, "*.yaml"))
		sort.Strings(m)
		files = m
	}
	var out []map[string]any
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, errs.Wrap(errs.InvalidArgument, err, "%s", f)
			}
			if doc != nil {
				out = append(out, doc)
			}
		}
	}
	return out, nil
}

// Apply server-side applies every object of path (namespaced objects
// without a namespace go to ns).
func Apply(ctx context.Context, kc *kube.Client, path, ns string) error {
	objs, err := Objects(path)
	if err != nil {
		return err
	}
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		r, ok := kinds[kind]
		if !ok {
			return errs.E(errs.InvalidArgument, "%s: kind %q not known to kubetest", path, kind)
		}
		meta, _ := o["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		ons, _ := meta["namespace"].(string)
		if r.Namespaced && ons == "" {
			ons = ns
			meta["namespace"] = ns
		}
		if err := kc.Apply(ctx, r, ons, name, "berth-kubetest", true, o, nil); err != nil {
			return err
		}
	}
	return nil
}

// InstallCRDs applies the CRDs in dir and waits until each is Established.
func InstallCRDs(ctx context.Context, kc *kube.Client, dir string) error {
	objs, err := Objects(dir)
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		return errs.E(errs.FailedPrecondition, "no CRDs in %s", dir)
	}
	if err := Apply(ctx, kc, dir, ""); err != nil {
		return err
	}
	for _, o := range objs {
		if o["kind"] != "CustomResourceDefinition" {
			continue
		}
		name := o["metadata"].(map[string]any)["name"].(string)
		for {
			var crd struct {
				Status struct {
					Conditions []kube.Condition `json:"conditions"`
				} `json:"status"`
			}
			if err := kc.Get(ctx, kube.CRDs, "", name, &crd); err != nil {
				return err
			}
			if c := kube.FindCondition(crd.Status.Conditions, "Established"); c != nil && c.Status == "True" {
				break
			}
			select {
			case <-ctx.Done():
				b, _ := json.Marshal(crd)
				return errs.E(errs.Unavailable, "CRD %s not established: %s", name, b)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// Kubectl is the kubectl binary among the assets ("" when it is not there).
func (s *Server) Kubectl() string {
	p := filepath.Join(s.Assets, "kubectl")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

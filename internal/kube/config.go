package kube

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berth-dev/berth/internal/errs"
)

// Config says how to reach and authenticate to the API server.
type Config struct {
	Server    string // https://host:port
	Token     string // bearer token
	CAData    []byte // PEM bundle the server's certificate must chain to
	CertData  []byte // client certificate (PEM), with KeyData
	KeyData   []byte
	Insecure  bool          // skip server certificate verification (kubeconfig insecure-skip-tls-verify)
	Namespace string        // default namespace
	Timeout   time.Duration // per request (0 = 30 s); watches are not bounded by it
}

// In-cluster service account files (a Pod's mounted token).
const (
	saDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// LoadConfig reads the kubeconfig at path; "" means $KUBECONFIG, then
// ~/.kube/config, then the in-cluster service account of a Pod.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		path = os.Getenv("KUBECONFIG")
		if i := strings.IndexByte(path, os.PathListSeparator); i >= 0 {
			path = path[:i]
		}
	}
	if path == "" {
		if home, err := os.UserHomeDir(); err == nil {
			if p := filepath.Join(home, ".kube", "config"); fileExists(p) {
				path = p
			}
		}
	}
	if path == "" {
		if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
			return InCluster()
		}
		return Config{}, errs.Field("kubeconfig", "no kubeconfig given, none in $KUBECONFIG or ~/.kube/config, and not in a Pod")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, errs.Wrap(errs.InvalidArgument, err, "kubeconfig")
	}
	return ParseKubeconfig(b, filepath.Dir(path))
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// InCluster is the configuration of a Pod's service account.
func InCluster() (Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errs.E(errs.FailedPrecondition, "not in a Pod: KUBERNETES_SERVICE_HOST/PORT unset")
	}
	tok, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return Config{}, errs.Wrap(errs.FailedPrecondition, err, "service account token")
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return Config{}, errs.Wrap(errs.FailedPrecondition, err, "service account CA")
	}
	ns, _ := os.ReadFile(filepath.Join(saDir, "namespace"))
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return Config{Server: "https://" + host + ":" + port, Token: strings.TrimSpace(string(tok)), CAData: ca,
		Namespace: strings.TrimSpace(string(ns))}, nil
}

type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Token                 string `yaml:"token"`
			TokenFile             string `yaml:"tokenFile"`
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster   string `yaml:"cluster"`
			User      string `yaml:"user"`
			Namespace string `yaml:"namespace"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// ParseKubeconfig reads a kubeconfig's current context (or its only
// context); relative file names are taken from dir.
func ParseKubeconfig(b []byte, dir string) (Config, error) {
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return Config{}, errs.Wrap(errs.InvalidArgument, err, "kubeconfig")
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	var cfg Config
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			clusterName, userName, cfg.Namespace, found = c.Context.Cluster, c.Context.User, c.Context.Namespace, true
		}
	}
	if !found {
		return Config{}, errs.Field("current-context", "context %q not in the kubeconfig", ctxName)
	}
	file := func(p string) ([]byte, error) {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return os.ReadFile(p)
	}
	data := func(field, inline, path string) ([]byte, error) {
		if inline != "" {
			v, err := base64.StdEncoding.DecodeString(inline)
			if err != nil {
				return nil, errs.ReclassifyField(field, err, "not base64")
			}
			return v, nil
		}
		if path != "" {
			v, err := file(path)
			if err != nil {
				return nil, errs.ReclassifyField(field, err, "read %s", path)
			}
			return v, nil
		}
		return nil, nil
	}
	var err error
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cfg.Server, cfg.Insecure = c.Cluster.Server, c.Cluster.InsecureSkipTLSVerify
		if cfg.CAData, err = data("certificate-authority-data", c.Cluster.CertificateAuthorityData, c.Cluster.CertificateAuthority); err != nil {
			return Config{}, err
		}
	}
	if !found {
		return Config{}, errs.Field("clusters", "cluster %q not in the kubeconfig", clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		cfg.Token = u.User.Token
		if cfg.Token == "" && u.User.TokenFile != "" {
			t, err := file(u.User.TokenFile)
			if err != nil {
				return Config{}, errs.ReclassifyField("tokenFile", err, "read %s", u.User.TokenFile)
			}
			cfg.Token = strings.TrimSpace(string(t))
		}
		if cfg.CertData, err = data("client-certificate-data", u.User.ClientCertificateData, u.User.ClientCertificate); err != nil {
			return Config{}, err
		}
		if cfg.KeyData, err = data("client-key-data", u.User.ClientKeyData, u.User.ClientKey); err != nil {
			return Config{}, err
		}
	}
	if cfg.Server == "" {
		return Config{}, errs.Field("server", "cluster %q has no server", clusterName)
	}
	return cfg, nil
}

// Kubeconfig renders cfg as a kubeconfig file (for kubectl and for
// `berth serve --cluster --kubeconfig`).
func (cfg Config) Kubeconfig() []byte {
	type m = map[string]any
	cluster := m{"server": cfg.Server}
	if cfg.Insecure {
		cluster["insecure-skip-tls-verify"] = true
	}
	if len(cfg.CAData) > 0 {
		cluster["certificate-authority-data"] = base64.StdEncoding.EncodeToString(cfg.CAData)
	}
	user := m{}
	if cfg.Token != "" {
		user["token"] = cfg.Token
	}
	if len(cfg.CertData) > 0 {
		user["client-certificate-data"] = base64.StdEncoding.EncodeToString(cfg.CertData)
		user["client-key-data"] = base64.StdEncoding.EncodeToString(cfg.KeyData)
	}
	ctx := m{"cluster": "berth", "user": "berth"}
	if cfg.Namespace != "" {
		ctx["namespace"] = cfg.Namespace
	}
	b, _ := yaml.Marshal(m{
		"apiVersion": "v1", "kind": "Config", "current-context": "berth",
		"clusters": []m{{"name": "berth", "cluster": cluster}},
		"users":    []m{{"name": "berth", "user": user}},
		"contexts": []m{{"name": "berth", "context": ctx}},
	})
	return b
}

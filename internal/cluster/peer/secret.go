package peer

import (
	"context"

	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
)

// SecretName is the Secret holding the cluster token (data key "token").
const SecretName = "berth-cluster"

// EnsureToken returns the cluster token of namespace ns, creating the
// Secret when no one has: the first replica or node to start makes it, a
// concurrent second one reads the winner's.
func EnsureToken(ctx context.Context, kc *kube.Client, ns string) (string, error) {
	for range 3 {
		var s kube.Secret
		err := kc.Get(ctx, kube.Secrets, ns, SecretName, &s)
		if err == nil {
			if t := string(s.Data["token"]); len(t) >= 32 {
				return t, nil
			}
			return "", errs.E(errs.FailedPrecondition, "secret %s/%s has no usable token", ns, SecretName)
		}
		if !errs.Is(err, errs.NotFound) {
			return "", err
		}
		s = kube.Secret{TypeMeta: kube.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: kube.ObjectMeta{Name: SecretName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "berth"}},
			Type:       "Opaque", Data: map[string][]byte{"token": []byte(NewToken())}}
		err = kc.Create(ctx, kube.Secrets, ns, &s, nil)
		if err == nil {
			return string(s.Data["token"]), nil
		}
		if !errs.Is(err, errs.AlreadyExists) {
			return "", err
		}
	}
	return "", errs.E(errs.Unavailable, "secret %s/%s: could not read or create it", ns, SecretName)
}

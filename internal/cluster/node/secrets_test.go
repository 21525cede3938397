package node

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth/internal/store"
)

func TestDecideSecrets(t *testing.T) {
	a := store.Secret{Owner: "alice", Name: "TOKEN", Host: "api.test", Header: "Authorization: Bearer {{value}}", Sealed: []byte("sealed-1")}
	a2 := a
	a2.Sealed = []byte("sealed-2") // a put through a replica: a new nonce
	aHost := a
	aHost.Host = "other.test"
	b := store.Secret{Owner: "bob", Name: "TOKEN", Host: "api.test", Header: "X-Key: {{value}}", Sealed: []byte("sealed-b")}
	// What the node's own store holds: sealed under its own key.
	local := func(s store.Secret) store.Secret { s.Sealed = []byte("node-sealed"); return s }
	applied := func(ss ...store.Secret) map[string]string {
		m := map[string]string{}
		for _, s := range ss {
			m[secretKey(s)] = secretVersion(s)
		}
		return m
	}
	names := func(ss []store.Secret) []string {
		var out []string
		for _, s := range ss {
			out = append(out, secretKey(s))
		}
		return out
	}
	for _, tc := range []struct {
		name           string
		cluster, local []store.Secret
		owners         map[string]bool // nil: alice and bob
		applied        map[string]string
		put, del       []string
	}{
		{"new", []store.Secret{a}, nil, nil, nil, []string{"alice/TOKEN"}, nil},
		{"in step", []store.Secret{a, b}, []store.Secret{local(a), local(b)}, nil, applied(a, b), nil, nil},
		{"value changed", []store.Secret{a2}, []store.Secret{local(a)}, nil, applied(a), []string{"alice/TOKEN"}, nil},
		{"after an agent restart every record is put once", []store.Secret{a}, []store.Secret{local(a)}, nil, map[string]string{}, []string{"alice/TOKEN"}, nil},
		{"removed here behind the agent's back", []store.Secret{a}, nil, nil, applied(a), []string{"alice/TOKEN"}, nil},
		{"host changed here", []store.Secret{a}, []store.Secret{local(aHost)}, nil, applied(a), []string{"alice/TOKEN"}, nil},
		{"deleted in the cluster", []store.Secret{b}, []store.Secret{local(a), local(b)}, nil, applied(a, b), nil, []string{"alice/TOKEN"}},
		{"set on the node only", nil, []store.Secret{local(b)}, nil, nil, nil, []string{"bob/TOKEN"}},
		{"same name, two owners", []store.Secret{a, b}, []store.Secret{local(b)}, nil, applied(b), []string{"alice/TOKEN"}, nil},
		{"an owner with nothing here is not mirrored", []store.Secret{a, b}, nil, map[string]bool{"bob": true}, nil, []string{"bob/TOKEN"}, nil},
		{"an owner's last sandbox left: dropped here", []store.Secret{a, b}, []store.Secret{local(a), local(b)}, map[string]bool{"bob": true}, applied(a, b), nil, []string{"alice/TOKEN"}},
		{"no owners here: nothing kept", []store.Secret{a}, []store.Secret{local(a)}, map[string]bool{}, applied(a), nil, []string{"alice/TOKEN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owners := tc.owners
			if owners == nil {
				owners = map[string]bool{"alice": true, "bob": true}
			}
			put, del := DecideSecrets(tc.cluster, tc.local, owners, tc.applied)
			if d := cmp.Diff(tc.put, names(put)); d != "" {
				t.Errorf("put (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.del, names(del)); d != "" {
				t.Errorf("delete (-want +got):\n%s", d)
			}
		})
	}
}

package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/api/wire"
	"github.com/berth-dev/berth/internal/errs"
	"github.com/berth-dev/berth/internal/kube"
	"github.com/berth-dev/berth/internal/kube/berthv1"
	"github.com/berth-dev/berth/internal/kubestore"
)

// Secrets through a replica: put, list (never the value) and delete with
// owner scoping as on one host; what etcd holds is the sealed value only,
// which the cluster data key (read as a node reads it) opens, bound to its
// owner and name; a second replica sees the same secrets.
func TestReplicaSecrets(t *testing.T) {
	noLeaks(t)
	c := newCluster(t)
	ctx := t.Context()
	const value = "tok-ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789"
	put := func(key, path, body string) (int, string) {
		st, _, b := c.do("PUT", c.url+path, key, body)
		return st, b
	}
	st, body := put(c.key, "/v1/secrets/TOKEN", `{"host":"api.example.com","value":"`+value+`"}`)
	var info wire.SecretInfo
	if err := json.Unmarshal([]byte(body), &info); st != 200 || err != nil || info.Name != "TOKEN" || info.Host != "api.example.com" ||
		info.Header != "Authorization: Bearer {{value}}" || info.CreatedAt.IsZero() {
		t.Fatalf("put: %d %s", st, body)
	}
	if strings.Contains(body, value) {
		t.Fatalf("the put's answer holds the value: %s", body)
	}
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/secrets/9BAD", `{"host":"api.example.com","value":"v"}`, "name"},
		{"/v1/secrets/OK", `{"host":"api.example.com:443","value":"v"}`, "host"},
		{"/v1/secrets/OK", `{"host":"*.example.com","value":"v"}`, "host"},
		{"/v1/secrets/OK", `{"host":"api.example.com","value":""}`, "value"},
		{"/v1/secrets/OK", `{"host":"api.example.com","value":"v","header":"X-Key: no placeholder"}`, "header"},
		{"/v1/secrets/OK", `{"host":"api.example.com","value":"a\nb"}`, "value"},
		{"/v1/secrets/OK", `{"host":"api.example.com","value":"v","extra":1}`, "extra"},
	} {
		if st, body := put(c.key, tc.path, tc.body); st != 400 || !strings.Contains(body, tc.field) {
			t.Errorf("put %s %s: %d %s (want 400 naming %s)", tc.path, tc.body, st, body, tc.field)
		}
	}

	// The record: sealed, no plaintext anywhere in the object; the data
	// key opens it for (alice, TOKEN) only.
	var rl berthv1.RecordList
	if err := srv.Client.List(ctx, berthv1.Records, c.ns, kube.ListOptions{LabelSelector: berthv1.LabelTable + "=" + kubestore.SecretsTable}, &rl); err != nil {
		t.Fatal(err)
	}
	if len(rl.Items) != 1 {
		t.Fatalf("%d secret records, want 1", len(rl.Items))
	}
	raw, _ := json.Marshal(rl.Items[0])
	if strings.Contains(string(raw), value) || strings.Contains(string(raw), "tok-ABCDEF") {
		t.Fatalf("the record holds the plaintext: %s", raw)
	}
	sec, err := c.st.GetSecret(ctx, "alice", "TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	sl, err := kubestore.EnsureSecretsKey(ctx, srv.Client, c.ns)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sl.Open(sec); err != nil || string(v) != value {
		t.Fatalf("open alice's TOKEN: %q %v", v, err)
	}
	moved := sec
	moved.Owner = "bob"
	if _, err := sl.Open(moved); !errs.Is(err, errs.PermissionDenied) {
		t.Fatalf("alice's sealed value opened as bob's: %v", err)
	}

	// Owner scoping: bob sees none, cannot delete alice's, cannot name her.
	_, _, body = c.do("GET", c.url+"/v1/secrets", c.bob, "")
	if !strings.Contains(body, `"secrets": []`) {
		t.Fatalf("bob's list: %s", body)
	}
	if st, _, body := c.do("GET", c.url+"/v1/secrets?owner=alice", c.bob, ""); st != 400 || !strings.Contains(body, "owner") {
		t.Fatalf("bob lists alice's: %d %s", st, body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/secrets/TOKEN", c.bob, ""); st != 404 {
		t.Fatalf("bob deletes alice's TOKEN: %d %s", st, body)
	}
	if st, _, body := c.do("DELETE", c.url+"/v1/secrets/TOKEN?owner=alice", c.bob, ""); st != 400 {
		t.Fatalf("bob deletes alice's TOKEN by owner: %d %s", st, body)
	}
	// bob's own TOKEN is another secret; the admin manages alice's.
	if st, body := put(c.bob, "/v1/secrets/TOKEN", `{"host":"other.example.com","value":"bobs","header":"X-Key: {{value}}"}`); st != 200 {
		t.Fatalf("bob's put: %d %s", st, body)
	}
	_, _, body = c.do("GET", c.url+"/v1/secrets?owner=alice", c.admin, "")
	var l wire.SecretList
	if err := json.Unmarshal([]byte(body), &l); err != nil || len(l.Secrets) != 1 || l.Secrets[0].Host != "api.example.com" || strings.Contains(body, value) {
		t.Fatalf("admin lists alice's: %s", body)
	}

	// A second replica reads the same store and key.
	_, url2 := c.replica()
	_, _, body = c.do("GET", url2+"/v1/secrets", c.key, "")
	if err := json.Unmarshal([]byte(body), &l); err != nil || len(l.Secrets) != 1 || l.Secrets[0].Name != "TOKEN" {
		t.Fatalf("alice's list on the second replica: %s", body)
	}
	// A put replaces: same CreatedAt, new value.
	if st, body := put(c.key, "/v1/secrets/TOKEN", `{"host":"api.example.com","value":"v2"}`); st != 200 {
		t.Fatalf("replace: %d %s", st, body)
	}
	sec2, _ := c.st.GetSecret(ctx, "alice", "TOKEN")
	if v, err := sl.Open(sec2); err != nil || string(v) != "v2" || !sec2.CreatedAt.Equal(sec.CreatedAt) {
		t.Fatalf("replaced: %q %v created %v (was %v)", v, err, sec2.CreatedAt, sec.CreatedAt)
	}
	if st, _, body := c.do("DELETE", url2+"/v1/secrets/TOKEN", c.key, ""); st != 204 {
		t.Fatalf("delete through the second replica: %d %s", st, body)
	}
	if st, _, _ := c.do("DELETE", c.url+"/v1/secrets/TOKEN", c.key, ""); st != 404 {
		t.Fatalf("delete again: %d", st)
	}
	if _, err := c.st.GetSecret(ctx, "bob", "TOKEN"); err != nil {
		t.Fatalf("bob's TOKEN after alice's delete: %v", err)
	}
}

// allowInternetAccess, as the SDKs send it (2.51: allow_internet_access only
// when set; 2.9.1: true unless set), decides the sandbox's egress policy.
// Egress itself is tested from inside sandboxes in test/e2e (TestEgressHoles,
// TestE2BInternetAccess); this suite has no network to reach.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { Sandbox as Sandbox291 } from 'e2b-old'
import { opts, runId, raw } from './env.js'

async function policyMode(id) {
  const r = await raw('GET', `/v1/sandboxes/${id}/net`)
  assert.equal(r.status, 200, r.text)
  return r.json.policy.mode
}

test('allowInternetAccess: false is deny-all, true allow-all (2.51 and 2.9.1)', async () => {
  for (const [name, create, access, want] of [
    ['2.51 false', Sandbox, false, 'deny-all'],
    ['2.51 true', Sandbox, true, 'allow-all'],
    ['2.9.1 false', Sandbox291, false, 'deny-all'],
    ['2.9.1 unset (sends true)', Sandbox291, undefined, 'allow-all'],
  ]) {
    const o = { ...opts, timeoutMs: 120_000, metadata: { run: runId, suite: 'network' } }
    if (access !== undefined) o.allowInternetAccess = access
    const sbx = await create.create('base', o)
    try {
      assert.equal(await policyMode(sbx.sandboxId), want, name)
    } finally {
      await sbx.kill()
    }
  }
})

// Signed file URLs (issue 15): sbx.uploadUrl()/downloadUrl() of a secure
// sandbox carry signature (+ signature_expiration); berth verifies both with
// the sandbox's own access token before serving, and refuses a tampered,
// expired or misused URL — SDK 2.51.0. The URLs go out as the SDK builds them
// (plain fetch, no headers, no token), as a browser would use them.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId } from './env.js'

let sbx, other

before(async () => {
  const o = { ...opts, secure: true, timeoutMs: 300_000 }
  sbx = await Sandbox.create('base', { ...o, metadata: { run: runId, suite: 'signed' } })
  other = await Sandbox.create('base', { ...o, metadata: { run: runId, suite: 'signed-other' } })
})

after(async () => {
  await sbx?.kill()
  await other?.kill()
})

async function upload(url, name, text) {
  const form = new FormData()
  form.append('file', new Blob([text]), name)
  return fetch(url, { method: 'POST', body: form })
}

function tamper(u, key, fn) {
  const url = new URL(u)
  url.searchParams.set(key, fn(url.searchParams.get(key)))
  return url.toString()
}

test('upload and download URLs work without headers, signed', async () => {
  const up = await sbx.uploadUrl('/home/user/signed.txt')
  const q = new URL(up).searchParams
  assert.match(q.get('signature'), /^v1_/)
  const res = await upload(up, 'signed.txt', 'through a signed URL')
  assert.equal(res.status, 200, await res.text())
  assert.equal(await sbx.files.read('/home/user/signed.txt'), 'through a signed URL')

  const down = await sbx.downloadUrl('/home/user/signed.txt')
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'through a signed URL')

  // With an expiration, and as root.
  const exp = await sbx.downloadUrl('/root/.profile', { user: 'root', useSignatureExpiration: 60 })
  assert.ok(new URL(exp).searchParams.get('signature_expiration'))
  assert.equal((await fetch(exp)).status, 200)
})

test('tampered, expired, misused and unsigned URLs are refused', async () => {
  await sbx.files.write('/home/user/secret.txt', 'not for you')
  const down = await sbx.downloadUrl('/home/user/secret.txt', { useSignatureExpiration: 120 })
  const refused = async (url, init, why) => {
    const r = await fetch(url, init)
    const body = await r.text()
    assert.equal(r.status, 401, `${why}: ${r.status} ${body}`)
    assert.doesNotMatch(body, /not for you/)
  }
  await refused(tamper(down, 'path', () => '/etc/shadow'), undefined, 'other path')
  await refused(tamper(down, 'signature', (s) => s.slice(0, -2) + (s.endsWith('AA') ? 'BB' : 'AA')), undefined, 'tampered signature')
  await refused(tamper(down, 'signature_expiration', (e) => String(Number(e) + 3600)), undefined, 'extended expiration')
  await refused(tamper(down, 'username', () => 'root'), undefined, 'other user')
  const stripped = new URL(down)
  stripped.searchParams.delete('signature_expiration')
  await refused(stripped.toString(), undefined, 'expiration removed')
  // A download URL cannot upload.
  const form = new FormData()
  form.append('file', new Blob(['overwritten']), 'secret.txt')
  await refused(down, { method: 'POST', body: form }, 'download URL used to upload')
  assert.equal(await sbx.files.read('/home/user/secret.txt'), 'not for you')
  // Expired (signed with an expiry in the past).
  await refused(await sbx.downloadUrl('/home/user/secret.txt', { useSignatureExpiration: -5 }), undefined, 'expired')
  // A valid signature of one sandbox, addressed to another.
  await refused(down, { headers: { 'E2b-Sandbox-Id': other.sandboxId } }, 'signature of another sandbox')
  // Unsigned.
  const unsigned = new URL(down)
  unsigned.searchParams.delete('signature')
  unsigned.searchParams.delete('signature_expiration')
  const r = await fetch(unsigned, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(r.status, 401)
  // After the sandbox is gone, its URLs serve nothing.
  const gone = await other.downloadUrl('/home/user/x')
  await other.kill()
  other = undefined
  const g = await fetch(gone)
  assert.notEqual(g.status, 200)
})

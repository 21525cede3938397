// Control plane with SDK 2.51.0: getInfo, list paging and metadata filter,
// setTimeout, pause twice, connect-resume, kill twice, raw error bodies.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId, rejectsWith, raw, apiUrl } from './env.js'

test('create answer and getInfo', async () => {
  const r = await raw('POST', '/v2/sandboxes', { body: { templateID: 'base', timeout: 120, metadata: { run: runId, suite: 'raw' } } })
  assert.equal(r.status, 201, r.text)
  assert.match(r.json.sandboxID, /^[a-z0-9]+$/)
  assert.equal(r.json.clientID, '6532622b')
  assert.match(r.json.envdVersion, /^\d+\.\d+\.\d+$/)
  assert.ok(r.json.envdAccessToken)
  const sbx = await Sandbox.connect(r.json.sandboxID, opts)
  try {
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, r.json.sandboxID)
    assert.equal(info.templateId, 'base')
    assert.equal(info.state, 'running')
    assert.equal(info.metadata.suite, 'raw')
    assert.ok(info.endAt > info.startedAt)
    // /health with the sandbox header is envd's (204); the token is per sandbox.
    const h = await fetch(apiUrl + '/health', { headers: { 'E2b-Sandbox-Id': info.sandboxId, 'X-Access-Token': r.json.envdAccessToken } })
    assert.equal(h.status, 204)
    // §8: /health needs no token; a wrong token on anything else is a 401.
    const open = await fetch(apiUrl + '/health', { headers: { 'E2b-Sandbox-Id': info.sandboxId } })
    assert.equal(open.status, 204)
    const bad = await fetch(apiUrl + '/files?path=/etc/hostname', { headers: { 'E2b-Sandbox-Id': info.sandboxId, 'X-Access-Token': 'not-the-token' } })
    assert.equal(bad.status, 401)
  } finally {
    await sbx.kill()
  }
})

test('errors: 401 without key, 400 for an unknown template, 404s, 501 JSON', async () => {
  let r = await raw('GET', '/v2/sandboxes', { key: '' })
  assert.equal(r.status, 401)
  assert.equal(r.json.code, 401)
  r = await raw('POST', '/v2/sandboxes', { body: { templateID: 'no-such-template' } })
  assert.equal(r.status, 400, r.text)
  assert.equal(r.json.code, 400)
  assert.match(r.json.message, /no-such-template/)
  r = await raw('GET', '/v2/templates')
  assert.equal(r.status, 501)
  assert.equal(r.json.code, 501)
  assert.equal(await Sandbox.kill('nosuchsandbox', opts), false)
  await rejectsWith(Sandbox.getInfo('nosuchsandbox', opts), 'SandboxNotFoundError')
  await rejectsWith(Sandbox.connect('nosuchsandbox', opts), 'SandboxNotFoundError')
})

test('list: paging with X-Next-Token and a metadata filter', async () => {
  const md = { run: runId, page: 'p', 'team.name': 'a b&c=d' }
  const made = []
  try {
    for (let i = 0; i < 3; i++) made.push(await Sandbox.create('base', { ...opts, timeoutMs: 300_000, metadata: md }))
    // A sandbox whose value differs only after the '&' must not match.
    made.push(await Sandbox.create('base', { ...opts, timeoutMs: 300_000, metadata: { ...md, 'team.name': 'a b' } }))
    const pager = Sandbox.list({ ...opts, limit: 2, query: { metadata: md } })
    const first = await pager.nextItems()
    assert.equal(first.length, 2)
    assert.equal(pager.hasNext, true)
    const second = await pager.nextItems()
    assert.equal(second.length, 1)
    assert.equal(pager.hasNext, false)
    const ids = [...first, ...second].map((s) => s.sandboxId).sort()
    assert.deepEqual(ids, made.slice(0, 3).map((s) => s.sandboxId).sort())
    assert.ok([...first, ...second].every((s) => s.state === 'running' && s.metadata['team.name'] === 'a b&c=d'))
    const running = await Sandbox.list({ ...opts, query: { metadata: md, state: ['running'] } }).nextItems()
    assert.equal(running.length, 3)
  } finally {
    for (const s of made) await s.kill()
  }
})

test('setTimeout, pause twice, connect-resume, kill twice', async () => {
  const sbx = await Sandbox.create('base', { ...opts, timeoutMs: 300_000, metadata: { run: runId, suite: 'pause' } })
  const id = sbx.sandboxId
  try {
    await sbx.setTimeout(600_000)
    let info = await sbx.getInfo()
    assert.ok(Math.abs(info.endAt - Date.now() - 600_000) < 30_000, `endAt ${info.endAt}`)
    await sbx.setTimeout(120_000)
    info = await sbx.getInfo()
    assert.ok(info.endAt - Date.now() < 200_000, 'shorter timeout did not move endAt earlier')

    await sbx.files.write('/home/user/before-pause.txt', 'kept')
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.pause(), false)
    info = await Sandbox.getInfo(id, opts)
    assert.equal(info.state, 'paused')
    const listed = await Sandbox.list({ ...opts, query: { metadata: { run: runId, suite: 'pause' } } }).nextItems()
    assert.deepEqual(listed.map((s) => [s.sandboxId, s.state]), [[id, 'paused']])
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.commands.run('true', { requestTimeoutMs: 10_000 }))
    await rejectsWith(sbx.setTimeout(60_000), 'SandboxNotFoundError')

    const again = await Sandbox.connect(id, { ...opts, timeoutMs: 300_000 })
    assert.equal(again.sandboxId, id)
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal(await again.files.read('/home/user/before-pause.txt'), 'kept')
    assert.equal((await again.commands.run('echo back')).stdout, 'back\n')
    // The old instance keeps working after its own connect().
    await sbx.connect()
    assert.equal((await sbx.commands.run('cat /home/user/before-pause.txt')).stdout, 'kept')

    // Connect to a running sandbox only extends endAt.
    const before = (await sbx.getInfo()).endAt
    await Sandbox.connect(id, { ...opts, timeoutMs: 10_000 })
    assert.ok((await sbx.getInfo()).endAt >= before, 'connect shortened endAt')

    // Kill while paused, twice.
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.kill(), true)
    assert.equal(await Sandbox.kill(id, opts), false)
    await rejectsWith(Sandbox.connect(id, opts), 'SandboxNotFoundError')
    await rejectsWith(Sandbox.getInfo(id, opts), 'SandboxNotFoundError')
  } finally {
    await Sandbox.kill(id, opts).catch(() => {})
  }
})

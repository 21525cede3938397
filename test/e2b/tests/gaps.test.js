// Base-SDK gaps (issue 15) with SDK 2.51.0: the API key shape, snapshots
// (create, list by sandbox and by name, create from one, delete), fork,
// getMetrics with a time range, list with startedAfter and paged paused
// sandboxes, and the error a command gets when its sandbox is killed.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId, raw, rejectsWith, sleep } from './env.js'

const apiKey = opts.apiKey

const made = []
async function create(suite, extra = {}) {
  const sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600_000, metadata: { run: runId, suite }, ...extra })
  made.push(sbx)
  return sbx
}

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

async function allSnapshots(o) {
  const out = []
  const p = Sandbox.listSnapshots({ ...opts, ...o })
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('API key: admin and tenant keys have the shape current SDKs check', async () => {
  assert.match(apiKey, /^e2b_[0-9a-f]+$/)
  const r = await raw('POST', '/v1/keys', { body: { owner: `k${runId}` } })
  assert.equal(r.status, 201, r.text)
  assert.match(r.json.key, /^e2b_[0-9a-f]+$/)
  assert.deepEqual(await Sandbox.list({ ...opts, apiKey: r.json.key }).nextItems(), [])
})

test('snapshots: create, list by sandbox and name, create from it, delete', async () => {
  const sbx = await create('snap')
  await sbx.files.write('/home/user/state.json', '{"step": 1}')
  const name = `snap-${runId}`
  const snap = await sbx.createSnapshot({ name })
  assert.match(snap.snapshotId, /^[a-z0-9]+$/)
  assert.deepEqual(snap.names, [name])
  const unnamed = await Sandbox.createSnapshot(sbx.sandboxId, opts)
  assert.deepEqual(unnamed.names, [])
  // The sandbox keeps running.
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')

  const bySandbox = []
  const p = sbx.listSnapshots({ limit: 1 })
  while (p.hasNext) bySandbox.push(...(await p.nextItems()))
  assert.deepEqual(bySandbox.map((s) => s.snapshotId).sort(), [snap.snapshotId, unnamed.snapshotId].sort())
  assert.deepEqual((await allSnapshots({ name })).map((s) => s.snapshotId), [snap.snapshotId])
  assert.ok((await allSnapshots({})).some((s) => s.snapshotId === unnamed.snapshotId))

  // Another owner sees none of them.
  const other = await raw('POST', '/v1/keys', { body: { owner: `o${runId}` } })
  assert.equal(other.status < 300, true, other.text)
  const otherKey = other.json.key
  const theirs = await raw('GET', '/snapshots', { key: otherKey })
  assert.equal(theirs.status, 200)
  assert.deepEqual(theirs.json, [])
  const as = { ...opts, apiKey: otherKey }
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, as), false)
  assert.equal(await Sandbox.deleteSnapshot(name, as), false)
  assert.deepEqual(await allSnapshots({ ...as, sandboxId: sbx.sandboxId }), [])
  for (const ref of [snap.snapshotId, name]) {
    await rejectsWith(Sandbox.create(ref, as), 'SandboxError', (err) => assert.match(err.message, /400: .*unknown template/))
  }
  await rejectsWith(Sandbox.createSnapshot(sbx.sandboxId, as), 'SandboxNotFoundError')
  await rejectsWith(Sandbox.fork(sbx.sandboxId, as), 'SandboxNotFoundError')
  await rejectsWith(Sandbox.getMetrics(sbx.sandboxId, as), 'SandboxNotFoundError')

  // Create from the snapshot, by id and by name: the files are there.
  const fromId = await Sandbox.create(snap.snapshotId, { ...opts, timeoutMs: 120_000 })
  made.push(fromId)
  assert.equal(await fromId.files.read('/home/user/state.json'), '{"step": 1}')
  const fromName = await Sandbox.create(name, { ...opts, timeoutMs: 120_000 })
  made.push(fromName)
  assert.equal(await fromName.files.read('/home/user/state.json'), '{"step": 1}')

  // Delete: refused while sandboxes boot from it, then deleted, then gone.
  await assert.rejects(Sandbox.deleteSnapshot(snap.snapshotId, opts), /used by/)
  await fromId.kill()
  await fromName.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, opts), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, opts), false)
  assert.equal(await Sandbox.deleteSnapshot(unnamed.snapshotId, opts), true)
  assert.deepEqual(await allSnapshots({ sandboxId: sbx.sandboxId }), [])
  await rejectsWith(Sandbox.createSnapshot('nosuchsandbox', opts), 'SandboxNotFoundError')
})

test('fork: children with the parent state, their own timeout', async () => {
  const sbx = await create('fork')
  await sbx.files.write('/home/user/forked.txt', 'from parent')
  const children = await sbx.fork({ count: 2, timeoutMs: 90_000 })
  assert.equal(children.length, 2)
  for (const c of children) {
    assert.ok(c instanceof Sandbox, String(c))
    made.push(c)
    assert.notEqual(c.sandboxId, sbx.sandboxId)
    assert.equal(await c.files.read('/home/user/forked.txt'), 'from parent')
    const info = await c.getInfo()
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 30_000 && left <= 95_000, `endAt in ${left} ms`)
  }
  // Children are independent of the parent and of each other.
  await children[0].files.write('/home/user/forked.txt', 'child 0')
  assert.equal(await children[1].files.read('/home/user/forked.txt'), 'from parent')
  assert.equal(await sbx.files.read('/home/user/forked.txt'), 'from parent')
  // Without a timeout a child keeps the parent's endAt.
  const [one] = await Sandbox.fork(sbx.sandboxId, opts)
  assert.ok(one instanceof Sandbox)
  made.push(one)
  const [pi, ci] = [await sbx.getInfo(), await one.getInfo()]
  assert.ok(Math.abs(pi.endAt.getTime() - ci.endAt.getTime()) < 5000, `parent ${pi.endAt.toISOString()} child ${ci.endAt.toISOString()}`)
  const bad = await raw('POST', `/sandboxes/${sbx.sandboxId}/fork`, { body: { count: 0 } })
  assert.equal(bad.status, 400, bad.text)
  await rejectsWith(Sandbox.fork('nosuchsandbox', opts), 'SandboxNotFoundError')
})

test('getMetrics: CPU, memory and disk from the cgroup, with a time range', async () => {
  const sbx = await create('metrics')
  const t0 = new Date()
  const first = await sbx.getMetrics()
  assert.ok(first.length >= 1, JSON.stringify(first))
  // Burn CPU for ~2 s and hold 64 MiB, then read again.
  await sbx.commands.run("python3 -c \"import time; b=bytearray(64<<20); e=time.time()+2\nwhile time.time()<e: pass\ntime.sleep(30)\"", { background: true })
  await sleep(2500)
  const ms = await sbx.getMetrics()
  const last = ms[ms.length - 1]
  assert.ok(ms.length >= 2, JSON.stringify(ms))
  assert.ok(last.timestamp instanceof Date && !isNaN(last.timestamp))
  assert.ok(last.cpuCount >= 1)
  assert.ok(last.cpuUsedPct > 10, `cpuUsedPct ${last.cpuUsedPct}`)
  assert.ok(last.memUsed > 64 << 20, `memUsed ${last.memUsed}`)
  assert.ok(last.memTotal >= last.memUsed)
  assert.ok(last.diskUsed > 0 && last.diskTotal >= last.diskUsed, `disk ${last.diskUsed}/${last.diskTotal}`)
  // A range that ends before the first reading is empty; one around it has it.
  assert.deepEqual(await sbx.getMetrics({ end: new Date(t0.getTime() - 60_000) }), [])
  // (The range is in whole seconds, as the SDK sends it.)
  const around = await sbx.getMetrics({ start: new Date(t0.getTime() - 2000), end: new Date(t0.getTime() + 400) })
  assert.ok(around.length >= 1 && around.every((m) => m.timestamp.getTime() < t0.getTime() + 1500), JSON.stringify(around))
  assert.ok(around.length < ms.length)
  await rejectsWith(Sandbox.getMetrics('nosuchsandbox', opts), 'SandboxNotFoundError')
})

test('list: startedAfter, and paused sandboxes page by page', async () => {
  const suite = 'listgap'
  const a = await create(suite)
  await sleep(1100)
  const cut = new Date()
  await sleep(1100)
  const b = await create(suite)
  const c = await create(suite)
  const md = { run: runId, suite }
  const after = await Sandbox.list({ ...opts, query: { metadata: md, startedAfter: cut } }).nextItems()
  assert.deepEqual(after.map((s) => s.sandboxId).sort(), [b.sandboxId, c.sandboxId].sort())
  // Running and paused together, one per page, newest first: c b a.
  assert.equal(await c.pause(), true)
  const mixed = Sandbox.list({ ...opts, limit: 1, query: { metadata: md, state: ['running', 'paused'] } })
  const order = []
  for (const want of [[c, 'paused'], [b, 'running'], [a, 'running']]) {
    assert.ok(mixed.hasNext)
    const page = await mixed.nextItems()
    assert.deepEqual(page.map((s) => [s.sandboxId, s.state]), [[want[0].sandboxId, want[1]]])
    order.push(page[0].sandboxId)
  }
  // The last full page carries no token: the SDK's hasNext is "header present".
  assert.equal(mixed.hasNext, false)
  assert.equal(mixed.nextToken, undefined)
  for (const s of [a, b]) assert.equal(await s.pause(), true)
  const p = Sandbox.list({ ...opts, limit: 1, query: { metadata: md, state: ['paused'] } })
  const seen = []
  for (let i = 0; i < 3; i++) {
    const page = await p.nextItems()
    assert.equal(page.length, 1)
    assert.equal(page[0].state, 'paused')
    seen.push(page[0].sandboxId)
    assert.equal(p.hasNext, i < 2, `hasNext after page ${i + 1}`)
  }
  assert.deepEqual(seen, [c, b, a].map((s) => s.sandboxId))
  const pausedAfter = await Sandbox.list({ ...opts, query: { metadata: md, state: ['paused'], startedAfter: cut } }).nextItems()
  assert.deepEqual(pausedAfter.map((s) => s.sandboxId).sort(), [b.sandboxId, c.sandboxId].sort())
  assert.deepEqual(await Sandbox.list({ ...opts, query: { metadata: md, state: ['running'] } }).nextItems(), [])
})

test('a command whose sandbox is killed mid-run gets the SDK\'s "killed" TimeoutError', async () => {
  const sbx = await create('killed')
  const cmd = await sbx.commands.run('sleep 120', { background: true })
  setTimeout(() => { Sandbox.kill(sbx.sandboxId, opts).catch(() => {}) }, 1000)
  await rejectsWith(cmd.wait(), 'TimeoutError', (err) => {
    assert.match(err.message, /sandbox was killed or reached its end of life/)
  })
  // A foreground run sees the same.
  const sbx2 = await create('killed')
  setTimeout(() => { Sandbox.kill(sbx2.sandboxId, opts).catch(() => {}) }, 1000)
  await rejectsWith(sbx2.commands.run('sleep 120'), 'TimeoutError', (err) => {
    assert.match(err.message, /sandbox was killed/)
  })
})

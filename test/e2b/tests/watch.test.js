// files.watchDir as E2B's own SDK tests use it — SDK 2.51.0: a write to an
// existing file is a WRITE event; recursive watches name nested files by
// their path below the watched dir, including in folders created after the
// watch started; includeEntry attaches the entry's info; allowNetworkMounts
// is accepted, and a file is refused.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, FilesystemEventType } from 'e2b'
import { opts, runId, rejectsWith } from './env.js'

let sbx

before(async () => {
  sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600_000, metadata: { run: runId, suite: 'watch' } })
})

after(async () => {
  await sbx?.kill()
})

// waitEvent resolves with the first event matching pred, or rejects after ms.
function collector() {
  const events = []
  const waiters = []
  const onEvent = (ev) => {
    events.push(ev)
    for (const w of waiters) if (!w.done && w.pred(ev)) { w.done = true; w.resolve(ev) }
  }
  const waitEvent = (pred, ms = 10_000) => {
    const hit = events.find(pred)
    if (hit) return Promise.resolve(hit)
    return new Promise((resolve, reject) => {
      const w = { pred, resolve, done: false }
      waiters.push(w)
      setTimeout(() => { if (!w.done) { w.done = true; reject(new Error(`no matching event in ${ms} ms; got ${JSON.stringify(events)}`)) } }, ms)
    })
  }
  return { onEvent, waitEvent, events }
}

test('watch: a write to an existing file is a WRITE event', async () => {
  await sbx.files.makeDir('wd')
  await sbx.files.write('wd/f.txt', 'one')
  const c = collector()
  const h = await sbx.files.watchDir('wd', c.onEvent)
  await sbx.files.write('wd/f.txt', 'two')
  await c.waitEvent((e) => e.type === FilesystemEventType.WRITE && e.name === 'f.txt')
  await h.stop()
})

test('watch: recursive, a nested file that existed before the watch', async () => {
  await sbx.files.makeDir('wr/nested')
  await sbx.files.write('wr/nested/f.txt', 'one')
  const c = collector()
  const h = await sbx.files.watchDir('wr', c.onEvent, { recursive: true })
  await sbx.files.write('wr/nested/f.txt', 'two')
  await c.waitEvent((e) => e.type === FilesystemEventType.WRITE && e.name === 'nested/f.txt')
  await h.stop()
})

test('watch: recursive, a folder created after the watch started', async () => {
  await sbx.files.makeDir('wa')
  const c = collector()
  const h = await sbx.files.watchDir('wa', c.onEvent, { recursive: true })
  await sbx.files.makeDir('wa/later')
  await c.waitEvent((e) => e.type === FilesystemEventType.CREATE && e.name === 'later')
  await sbx.files.write('wa/later/f.txt', 'x')
  await c.waitEvent((e) => e.type === FilesystemEventType.WRITE && e.name === 'later/f.txt')
  // Deeper still, made in one go by a command: mkdir -p then write at once.
  await sbx.commands.run('mkdir -p wa/a/b/c && echo hi > wa/a/b/c/g.txt')
  await c.waitEvent((e) => e.name === 'a/b/c/g.txt' && (e.type === FilesystemEventType.CREATE || e.type === FilesystemEventType.WRITE))
  await h.stop()
})

test('watch: non-recursive sees no nested events', async () => {
  await sbx.files.makeDir('wn/sub')
  const c = collector()
  const h = await sbx.files.watchDir('wn', c.onEvent)
  await sbx.files.write('wn/sub/f.txt', 'x')
  await sbx.files.write('wn/top.txt', 'x')
  await c.waitEvent((e) => e.name === 'top.txt')
  await h.stop()
  assert.ok(!c.events.some((e) => e.name.includes('/')), JSON.stringify(c.events))
})

test('watch: includeEntry attaches entry info (not for remove or rename)', async () => {
  await sbx.files.makeDir('we')
  const c = collector()
  const h = await sbx.files.watchDir('we', c.onEvent, { includeEntry: true })
  await sbx.files.write('we/f.txt', 'hello')
  const ev = await c.waitEvent((e) => e.type === FilesystemEventType.WRITE && e.name === 'f.txt')
  assert.ok(ev.entry, JSON.stringify(ev))
  assert.equal(ev.entry.name, 'f.txt')
  assert.equal(ev.entry.type, 'file')
  assert.equal(ev.entry.path, '/home/user/we/f.txt')
  await c.waitEvent((e) => e.type === FilesystemEventType.WRITE && e.name === 'f.txt' && e.entry?.size === 5)
  await sbx.files.makeDir('we/d')
  const dev = await c.waitEvent((e) => e.type === FilesystemEventType.CREATE && e.name === 'd')
  assert.equal(dev.entry?.type, 'dir')
  await sbx.files.remove('we/f.txt')
  const rm = await c.waitEvent((e) => e.type === FilesystemEventType.REMOVE && e.name === 'f.txt')
  assert.equal(rm.entry, undefined)
  await h.stop()

  // Without includeEntry no entry is sent.
  const c2 = collector()
  const h2 = await sbx.files.watchDir('we', c2.onEvent)
  await sbx.files.write('we/g.txt', 'x')
  const ev2 = await c2.waitEvent((e) => e.name === 'g.txt')
  assert.equal(ev2.entry, undefined)
  await h2.stop()
})

test('watch: allowNetworkMounts is accepted; a file or a missing dir is refused', async () => {
  await sbx.files.makeDir('wm')
  const c = collector()
  const h = await sbx.files.watchDir('wm', c.onEvent, { allowNetworkMounts: true, recursive: true })
  await sbx.files.write('wm/f.txt', 'x')
  await c.waitEvent((e) => e.name === 'f.txt')
  await h.stop()
  await sbx.files.write('wfile.txt', 'x')
  await rejectsWith(sbx.files.watchDir('wfile.txt', () => {}), 'SandboxError')
  await rejectsWith(sbx.files.watchDir('no-such-dir', () => {}), 'NotFoundError')
})

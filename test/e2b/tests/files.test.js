// files.*: round trips, 64 MiB, multi-file upload with directories, list,
// exists, makeDir, rename, remove, watchDir — SDK 2.51.0.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { opts, runId, rejectsWith, sleep } from './env.js'

let sbx

before(async () => {
  sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600_000, metadata: { run: runId, suite: 'files' } })
})

after(async () => {
  await sbx?.kill()
})

const sha = (b) => createHash('sha256').update(b).digest('hex')

test('text and binary round trips', async () => {
  const info = await sbx.files.write('/home/user/hello.txt', 'héllo\n')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'héllo\n')
  const all = new Uint8Array(256).map((_, i) => i)
  await sbx.files.write('bin.dat', all)
  const back = await sbx.files.read('/home/user/bin.dat', { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(all))
  await sbx.files.write('/home/user/empty.txt', '')
  assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
})

test('64 MiB up and down', async () => {
  const big = randomBytes(64 << 20)
  await sbx.files.write('/home/user/big.bin', big)
  const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.equal(sha(Buffer.from(back)), sha(big))
  const r = await sbx.commands.run('sha256sum /home/user/big.bin')
  assert.equal(r.stdout.split(' ')[0], sha(big))
})

test('multi-file upload keeps directories; overwrite truncates', async () => {
  const res = await sbx.files.write([
    { path: '/home/user/x/a.txt', data: 'A' },
    { path: 'rel/y/b.txt', data: 'BB' },
  ])
  assert.deepEqual(res.map((e) => e.path).sort(), ['/home/user/rel/y/b.txt', '/home/user/x/a.txt'])
  assert.equal(await sbx.files.read('/home/user/x/a.txt'), 'A')
  assert.equal(await sbx.files.read('/home/user/rel/y/b.txt'), 'BB')
  assert.equal((await sbx.commands.run('stat -c %U /home/user/rel/y /home/user/rel/y/b.txt')).stdout, 'user\nuser\n')
  await sbx.files.write('/home/user/x/a.txt', 'short')
  await sbx.files.write('/home/user/x/a.txt', 'S')
  assert.equal(await sbx.files.read('/home/user/x/a.txt'), 'S')
})

test('stream upload goes raw (octet-stream) and arrives', async () => {
  const data = randomBytes(1 << 20)
  const stream = new ReadableStream({ start(c) { c.enqueue(data); c.close() } })
  await sbx.files.write('/home/user/streamed.bin', stream)
  const back = await sbx.files.read('/home/user/streamed.bin', { format: 'bytes' })
  assert.equal(sha(Buffer.from(back)), sha(data))
})

test('user: a file written as root is root-owned', async () => {
  await sbx.files.write('/tmp/rootfile', 'r', { user: 'root' })
  assert.equal((await sbx.commands.run('stat -c %U /tmp/rootfile')).stdout, 'root\n')
})

test('read errors', async () => {
  await rejectsWith(sbx.files.read('/home/user/missing.txt'), 'FileNotFoundError')
  await rejectsWith(sbx.files.read('/home/user'), 'InvalidArgumentError')
})

test('exists, getInfo, makeDir, list, rename, remove', async () => {
  assert.equal(await sbx.files.exists('/home/user/hello.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope.txt'), false)
  const info = await sbx.files.getInfo('/home/user/hello.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.size, 7)
  assert.ok(info.modifiedTime instanceof Date)

  assert.equal(await sbx.files.makeDir('/home/user/d/e'), true)
  assert.equal(await sbx.files.makeDir('/home/user/d/e'), false)
  await rejectsWith(sbx.files.makeDir('/home/user/hello.txt/sub'), 'InvalidArgumentError')
  await sbx.files.write('/home/user/d/e/f.txt', 'f')
  await sbx.files.write('/home/user/d/g.txt', 'g')

  const one = await sbx.files.list('/home/user/d')
  assert.deepEqual(one.map((e) => [e.name, e.type]).sort(), [['e', 'dir'], ['g.txt', 'file']])
  assert.equal(typeof one[0].size, 'number')
  const two = await sbx.files.list('/home/user/d', { depth: 2 })
  assert.deepEqual(two.map((e) => e.path).sort(), ['/home/user/d/e', '/home/user/d/e/f.txt', '/home/user/d/g.txt'])

  const moved = await sbx.files.rename('/home/user/d/g.txt', '/home/user/d2/h.txt')
  assert.equal(moved.path, '/home/user/d2/h.txt')
  assert.equal(await sbx.files.read('/home/user/d2/h.txt'), 'g')
  await rejectsWith(sbx.files.rename('/home/user/none', '/home/user/none2'), 'NotFoundError')

  await sbx.files.remove('/home/user/d')
  assert.equal(await sbx.files.exists('/home/user/d'), false)
  await sbx.files.remove('/home/user/d') // missing is fine
})

test('watchDir', async () => {
  await sbx.files.makeDir('/home/user/w')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/w', (ev) => events.push(ev), { timeoutMs: 30_000 })
  await sbx.files.write('/home/user/w/new.txt', 'x')
  for (let i = 0; i < 50 && !events.some((e) => e.name === 'new.txt'); i++) await sleep(100)
  await handle.stop()
  assert.ok(events.some((e) => e.name === 'new.txt' && (e.type === 'create' || e.type === 'write')), JSON.stringify(events))
  await rejectsWith(sbx.files.watchDir('/home/user/not-there', () => {}), 'NotFoundError')
})

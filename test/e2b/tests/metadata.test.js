// File metadata (issue 15): files.write(..., { metadata }) stores user.e2b.*
// xattrs in the sandbox; getInfo, list and rename report them; a write
// replaces them; bounds are refused with a 400 naming the header — SDK 2.51.0.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId, rejectsWith } from './env.js'

let sbx

before(async () => {
  sbx = await Sandbox.create('base', { ...opts, timeoutMs: 300_000, metadata: { run: runId, suite: 'metadata' } })
})

after(async () => {
  await sbx?.kill()
})

test('write with metadata: returned, stored as user.e2b.* xattrs, on getInfo, list and rename', async () => {
  const meta = { 'Owner-Team': 'infra', step: '3', empty: '' }
  const want = { 'owner-team': 'infra', step: '3', empty: '' } // keys lowercased, as envd does
  const w = await sbx.files.write('/home/user/m.txt', 'x', { metadata: meta })
  assert.deepEqual(w.metadata, want)
  // Really xattrs inside the sandbox, where tools see them.
  const r = await sbx.commands.run(`python3 -c "import os; print(sorted((k, os.getxattr('/home/user/m.txt', k).decode()) for k in os.listxattr('/home/user/m.txt')))"`)
  assert.equal(r.stdout.trim(), "[('user.e2b.empty', ''), ('user.e2b.owner-team', 'infra'), ('user.e2b.step', '3')]")

  assert.deepEqual((await sbx.files.getInfo('/home/user/m.txt')).metadata, want)
  const listed = (await sbx.files.list('/home/user')).find((e) => e.name === 'm.txt')
  assert.deepEqual(listed.metadata, want)
  // One set out of band is reported too; other user.* xattrs are not.
  await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/m.txt', 'user.e2b.late', b'1'); os.setxattr('/home/user/m.txt', 'user.other', b'no')"`)
  const moved = await sbx.files.rename('/home/user/m.txt', '/home/user/n.txt')
  assert.equal(moved.path, '/home/user/n.txt')
  assert.deepEqual(moved.metadata, { ...want, late: '1' })

  // A file without metadata reports none.
  await sbx.files.write('/home/user/plain.txt', 'p')
  assert.equal((await sbx.files.getInfo('/home/user/plain.txt')).metadata, undefined)
  // A write replaces the set; one without metadata clears it.
  const again = await sbx.files.write('/home/user/n.txt', 'y', { metadata: { step: '4' } })
  assert.deepEqual(again.metadata, { step: '4' })
  await sbx.files.write('/home/user/n.txt', 'z')
  assert.equal((await sbx.files.getInfo('/home/user/n.txt')).metadata, undefined)
  // Multi-file upload: the same metadata on every file.
  const many = await sbx.files.write([{ path: '/home/user/a.txt', data: 'a' }, { path: '/home/user/b.txt', data: 'b' }], { metadata: { batch: '7' } })
  assert.deepEqual(many.map((f) => f.metadata), [{ batch: '7' }, { batch: '7' }])
  assert.deepEqual((await sbx.files.getInfo('/home/user/b.txt')).metadata, { batch: '7' })
})

test('metadata over the bounds: 400 naming the header, nothing written', async () => {
  await rejectsWith(sbx.files.write('/home/user/big.txt', 'x', { metadata: { k: 'v'.repeat(5000) } }), 'InvalidArgumentError',
    (err) => assert.match(err.message, /X-Metadata-/))
  const tooMany = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v']))
  await rejectsWith(sbx.files.write('/home/user/big.txt', 'x', { metadata: tooMany }), 'InvalidArgumentError',
    (err) => assert.match(err.message, /X-Metadata-.*at most 64 keys/))
  await rejectsWith(sbx.files.write('/home/user/big.txt', 'x', { metadata: { ['k'.repeat(247)]: 'v' } }), 'InvalidArgumentError',
    (err) => assert.match(err.message, /X-Metadata-k+: key is 247 bytes/))
  assert.equal(await sbx.files.exists('/home/user/big.txt'), false)
})

// Older SDKs: 2.9.1 (betaPause, REST /files and /health without sandbox
// headers, routed by X-Access-Token) and 2.50.0 (v1 create and connect).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox as Sandbox291 } from 'e2b-old'
import { Sandbox as Sandbox250 } from 'e2b-250'
import { opts, runId, rejectsWith } from './env.js'

test('2.9.1: commands, files by token, betaPause, connect, kill', async () => {
  const sbx = await Sandbox291.create('base', { ...opts, timeoutMs: 300_000, metadata: { run: runId, suite: 'old' } })
  const id = sbx.sandboxId
  try {
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    await rejectsWith(sbx.commands.run('exit 4'), 'CommandExitError', (err) => assert.equal(err.exitCode, 4))
    await sbx.files.write('/home/user/old.txt', 'from 2.9.1')
    assert.equal(await sbx.files.read('/home/user/old.txt'), 'from 2.9.1')
    await sbx.files.write([{ path: '/home/user/o/a.txt', data: 'A' }, { path: 'o/b/c.txt', data: 'C' }])
    assert.equal(await sbx.files.read('/home/user/o/b/c.txt'), 'C')
    assert.equal(await sbx.isRunning(), true)
    assert.deepEqual((await sbx.files.list('/home/user/o')).map((e) => e.name).sort(), ['a.txt', 'b'])

    assert.equal(await sbx.betaPause(), true)
    assert.equal(await sbx.betaPause(), false)
    assert.equal((await Sandbox291.getInfo(id, opts)).state, 'paused')
    const again = await Sandbox291.connect(id, { ...opts, timeoutMs: 300_000 })
    assert.equal(again.sandboxId, id)
    assert.equal(await again.files.read('/home/user/old.txt'), 'from 2.9.1')
    await again.kill() // 2.9.1's instance kill() resolves to undefined
    assert.equal(await Sandbox291.kill(id, opts), false)
  } finally {
    await Sandbox291.kill(id, opts).catch(() => {})
  }
})

test('2.50.0: v1 create, connect to a running sandbox, kill', async () => {
  const sbx = await Sandbox250.create('base', { ...opts, timeoutMs: 300_000, metadata: { run: runId, suite: 'v250' } })
  try {
    assert.equal((await sbx.commands.run('echo $HOME')).stdout, '/home/user\n')
    const again = await Sandbox250.connect(sbx.sandboxId, { ...opts, timeoutMs: 60_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    await again.files.write('/home/user/v250.txt', 'ok')
    assert.equal(await sbx.files.read('/home/user/v250.txt'), 'ok')
  } finally {
    assert.equal(await sbx.kill(), true)
  }
})

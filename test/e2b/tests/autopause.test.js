// Filesystem-only auto-pause (issue 15): lifecycle.onTimeout
// {action:'pause', keepMemory:false} (autoPause + autoPauseMemory:false on
// the wire) pauses to disk at expiry — berth's disk pause, recorded on the
// sandbox — and connect boots it again with its files — SDK 2.51.0.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId, raw, rejectsWith, sleep } from './env.js'

const made = []
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

async function waitPaused(id, ms) {
  const deadline = Date.now() + ms
  for (;;) {
    const info = await Sandbox.getInfo(id, opts)
    if (info.state === 'paused') return info
    if (Date.now() > deadline) throw new Error(`sandbox ${id} still ${info.state} after ${ms} ms`)
    await sleep(500)
  }
}

test('expiry pauses to disk, recorded; connect resumes with the files, not the processes', async () => {
  const sbx = await Sandbox.create('base', {
    ...opts, timeoutMs: 4_000, metadata: { run: runId, suite: 'autopause' },
    lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
  })
  made.push(sbx)
  const before = await raw('GET', `/sandboxes/${sbx.sandboxId}`)
  assert.equal(before.status, 200, before.text)
  assert.deepEqual(before.json.lifecycle, { onTimeout: 'pause', autoResume: false, keepMemory: false })
  await sbx.files.write('/home/user/kept.txt', 'on disk')
  await sbx.commands.run('sleep 600', { background: true })

  const info = await waitPaused(sbx.sandboxId, 60_000)
  assert.equal(info.lifecycle.onTimeout, 'pause')
  // E2B reports a pausing sandbox as paused; berth's record is complete once paused.
  for (let i = 0; (await raw('GET', `/v1/sandboxes/${sbx.sandboxId}`)).json.state !== 'paused'; i++) {
    assert.ok(i < 120, 'berth state never reached paused')
    await sleep(500)
  }
  const detail = await raw('GET', `/sandboxes/${sbx.sandboxId}`)
  assert.equal(detail.json.state, 'paused')
  assert.equal(detail.json.pause_mode_requested, 'disk')
  assert.equal(detail.json.pause_mode, 'disk')
  // berth's own record: the expiry asked for a disk pause and got one.
  const v1 = await raw('GET', `/v1/sandboxes/${sbx.sandboxId}`)
  assert.equal(v1.status, 200, v1.text)
  assert.equal(v1.json.pause_mode_requested, 'disk')
  assert.equal(v1.json.pause_mode, 'disk')
  const ev = await raw('GET', `/v1/sandboxes/${sbx.sandboxId}/events`)
  assert.ok(JSON.stringify(ev.json).includes('expired'), ev.text)
  // No auto-resume by traffic: envd answers as for a paused sandbox.
  assert.equal(await sbx.isRunning(), false)

  const back = await Sandbox.connect(sbx.sandboxId, { ...opts, timeoutMs: 120_000 })
  assert.equal(await back.files.read('/home/user/kept.txt'), 'on disk')
  const ps = await back.commands.run('pgrep -x sleep || echo none')
  assert.equal(ps.stdout.trim(), 'none')
})

test('memory auto-pause is unchanged: the expiry asks for a memory pause', async () => {
  const sbx = await Sandbox.create('base', {
    ...opts, timeoutMs: 4_000, metadata: { run: runId, suite: 'autopause-mem' },
    lifecycle: { onTimeout: 'pause' },
  })
  made.push(sbx)
  const before = await raw('GET', `/sandboxes/${sbx.sandboxId}`)
  assert.deepEqual(before.json.lifecycle, { onTimeout: 'pause', autoResume: false, keepMemory: true })
  await waitPaused(sbx.sandboxId, 60_000)
  const v1 = await raw('GET', `/v1/sandboxes/${sbx.sandboxId}`)
  assert.notEqual(v1.json.pause_mode_requested, 'disk')
})

test('auto-resume with a filesystem-only pause is refused (SDK and server)', async () => {
  await rejectsWith(Sandbox.create('base', { ...opts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }), 'InvalidArgumentError')
  const r = await raw('POST', '/v2/sandboxes', { body: { templateID: 'base', autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } } })
  assert.equal(r.status, 400, r.text)
  assert.match(r.json.message, /autoResume/)
})

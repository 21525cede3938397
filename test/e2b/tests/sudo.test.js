// sudo through the SDK (issue 15): the default template's passwordless sudo
// works for its user — setuid is honoured inside a user-namespaced runc
// sandbox (see SECURITY.md) — SDK 2.51.0.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId } from './env.js'

let sbx

before(async () => {
  sbx = await Sandbox.create('base', { ...opts, timeoutMs: 300_000, metadata: { run: runId, suite: 'sudo' } })
})

after(async () => {
  await sbx?.kill()
})

test('sudo echo ok as the default user', async () => {
  const who = await sbx.commands.run('id -un')
  assert.equal(who.stdout, 'user\n')
  const r = await sbx.commands.run('sudo echo ok')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'ok\n')
})

test('sudo gives root: writes where only root may, file owned by root', async () => {
  const r = await sbx.commands.run('sudo sh -c "id -u; echo installed > /usr/local/bin/by-sudo" && stat -c %U /usr/local/bin/by-sudo')
  assert.equal(r.stdout, '0\nroot\n')
  await assert.rejects(sbx.commands.run('echo nope > /usr/local/bin/by-user'), (err) => err.exitCode !== 0)
})

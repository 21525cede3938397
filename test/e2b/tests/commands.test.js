// commands.*: exit codes, output, env, cwd, user, timeouts, background
// processes, stdin — SDK 2.51.0.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { opts, runId, rejectsWith, sleep } from './env.js'

let sbx

before(async () => {
  sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600_000, envs: { A: '1' }, metadata: { run: runId, suite: 'commands' } })
})

after(async () => {
  await sbx?.kill()
})

test('run: stdout, stderr, exit 0', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
})

test('run: non-zero exit throws CommandExitError', async () => {
  await rejectsWith(sbx.commands.run('echo partial; exit 3'), 'CommandExitError', (err) => {
    assert.equal(err.exitCode, 3)
    assert.equal(err.error, 'exit status 3')
    assert.equal(err.stdout, 'partial\n')
  })
})

test('run: large output with multibyte characters arrives intact', async () => {
  const r = await sbx.commands.run("for i in $(seq 1 20000); do echo 'héllo wörld ✓ 日本語'; done")
  const lines = r.stdout.split('\n')
  assert.equal(lines.length, 20001)
  assert.ok(lines.slice(0, -1).every((l) => l === 'héllo wörld ✓ 日本語'))
})

test('env: create-time envs, per-command envs win, HOME/USER', async () => {
  assert.equal((await sbx.commands.run('echo $A')).stdout, '1\n')
  assert.equal((await sbx.commands.run('echo $A', { envs: { A: '2' } })).stdout, '2\n')
  assert.equal((await sbx.commands.run('echo $HOME:$USER:$LOGNAME')).stdout, '/home/user:user:user\n')
})

test('cwd: default home, absolute, relative, missing', async () => {
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  await sbx.commands.run('mkdir -p sub')
  assert.equal((await sbx.commands.run('pwd', { cwd: 'sub' })).stdout, '/home/user/sub\n')
  await rejectsWith(sbx.commands.run('pwd', { cwd: '/does/not/exist' }), 'InvalidArgumentError')
})

test('user: default user, root, unknown', async () => {
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  await rejectsWith(sbx.commands.run('whoami', { user: 'nosuchuser' }), 'AuthenticationError')
})

test('timeout: the process is killed and TimeoutError raised', async () => {
  const t0 = Date.now()
  await rejectsWith(sbx.commands.run('sleep 30; touch /tmp/should-not-exist', { timeoutMs: 2000 }), 'TimeoutError')
  assert.ok(Date.now() - t0 < 15_000)
  // The kill is immediate; give the reaper a moment to unlist it.
  let listed = true
  for (let i = 0; i < 20 && listed; i++) {
    listed = (await sbx.commands.list()).some((p) => p.args.join(' ').includes('should-not-exist'))
    if (listed) await sleep(100)
  }
  assert.ok(!listed, 'timed-out process still listed')
})

test('background: list, disconnect, reconnect, kill, kill again', async () => {
  const h = await sbx.commands.run('sleep 300', { background: true })
  assert.ok(h.pid > 0)
  let ps = await sbx.commands.list()
  assert.ok(ps.some((p) => p.pid === h.pid), 'pid not listed')
  await h.disconnect()
  await sleep(300)
  ps = await sbx.commands.list()
  assert.ok(ps.some((p) => p.pid === h.pid), 'disconnect killed the process')
  const h2 = await sbx.commands.connect(h.pid)
  assert.equal(await h2.kill(), true)
  await rejectsWith(h2.wait(), 'CommandExitError', (err) => {
    assert.equal(err.exitCode, -1)
    assert.equal(err.error, 'signal: killed')
  })
  for (let i = 0; i < 50 && (await sbx.commands.list()).some((p) => p.pid === h.pid); i++) await sleep(100)
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid), 'killed pid still listed')
  assert.equal(await sbx.commands.kill(h.pid), false)
})

test('stdin: sendStdin then closeStdin', async () => {
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'abc\n')
  await sbx.commands.closeStdin(h.pid)
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'abc\n')
  // Without stdin, cat sees /dev/null and exits at once.
  assert.equal((await sbx.commands.run('cat')).stdout, '')
})

test('isRunning', async () => {
  assert.equal(await sbx.isRunning(), true)
})

// @e2b/code-interpreter 2.8.0, unmodified, against berth's code-interpreter-v1
// template (templates/code-interpreter): runCode over port 49999, routed by
// the E2b-Sandbox-Id / E2b-Sandbox-Port headers to berth's own server in the
// sandbox. run.sh builds (or imports from the cache) the template first.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { opts, runId, rejectsWith, apiUrl, raw } from './env.js'

const md = { run: runId, suite: 'code-interpreter' }
let sbx

before(async () => {
  // No template argument: the SDK asks for code-interpreter-v1 itself.
  sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000, metadata: md })
})

after(async () => {
  await sbx?.kill()
})

test('create asks for code-interpreter-v1', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'code-interpreter-v1')
})

test('runCode: arithmetic, execution count, text of the main result', async () => {
  const ex = await sbx.runCode('1 + 1')
  assert.equal(ex.error, undefined)
  assert.equal(ex.text, '2')
  assert.equal(ex.results.length, 1)
  assert.equal(ex.results[0].isMainResult, true)
  assert.ok(ex.executionCount >= 1, `executionCount ${ex.executionCount}`)
})

test('runCode: stdout and stderr stream to the callbacks in order', async () => {
  const out = []
  const err = []
  const ex = await sbx.runCode(
    'import sys, time\nfor i in range(3):\n    print("out", i, flush=True)\n    time.sleep(0.05)\nprint("bad", file=sys.stderr)',
    { onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line) })
  assert.equal(out.join(''), 'out 0\nout 1\nout 2\n')
  assert.equal(err.join(''), 'bad\n')
  assert.deepEqual(ex.logs.stdout, out)
  assert.deepEqual(ex.logs.stderr, err)
  assert.equal(ex.text, undefined)
})

test('runCode: a matplotlib figure comes back as a PNG', async () => {
  const ex = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3))\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title("berth")\nplt.show()')
  assert.equal(ex.error, undefined, ex.error?.traceback)
  const png = ex.results.find((r) => r.png)
  assert.ok(png, `no png in ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
  const buf = Buffer.from(png.png, 'base64')
  assert.deepEqual([...buf.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature')
  // IHDR: width and height (4x3 inches at matplotlib's inline 100 dpi... or more).
  const w = buf.readUInt32BE(16)
  const h = buf.readUInt32BE(20)
  assert.ok(w >= 200 && h >= 150 && buf.length > 2000, `png ${w}x${h}, ${buf.length} bytes`)
})

test('runCode: a DataFrame comes back as HTML and text', async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "n": [3, 4]})')
  assert.equal(ex.error, undefined, ex.error?.traceback)
  const r = ex.results[0]
  assert.ok(r.isMainResult)
  assert.match(r.html, /<table[\s\S]*Oslo[\s\S]*Lima[\s\S]*<\/table>/)
  assert.match(r.text, /city\s+n/)
  assert.ok(r.formats().includes('html'))
})

test('runCode: an exception is name, value and traceback', async () => {
  const errs = []
  const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (e) => errs.push(e) })
  assert.ok(ex.error)
  assert.equal(ex.error.name, 'ZeroDivisionError')
  assert.equal(ex.error.value, 'division by zero')
  // IPython's traceback, colours included (as E2B sends it).
  const tb = ex.error.traceback.replace(/\x1b\[[0-9;]*m/g, '')
  assert.match(tb, /ZeroDivisionError/)
  assert.match(tb, /return 1 \/ 0/)
  assert.equal(errs.length, 1)
})

test('runCode: variables persist between calls; envs apply to one call', async () => {
  await sbx.runCode('counter = 40')
  await sbx.runCode('counter += 1')
  assert.equal((await sbx.runCode('counter + 1')).text, '42')
  const ex = await sbx.runCode('import os\nos.environ.get("BERTH_CI_VAR")', { envs: { BERTH_CI_VAR: 'only-now' } })
  assert.equal(ex.text, "'only-now'")
  assert.equal((await sbx.runCode('import os\nstr(os.environ.get("BERTH_CI_VAR"))')).text, "'None'")
})

test('contexts: two contexts are isolated; list, restart, remove', async () => {
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal(a.language, 'python')
  assert.equal(b.cwd, '/tmp')
  assert.notEqual(a.id, b.id)
  await sbx.runCode('x = "in a"', { context: a })
  await sbx.runCode('x = "in b"', { context: b })
  assert.equal((await sbx.runCode('x', { context: a })).text, "'in a'")
  assert.equal((await sbx.runCode('x', { context: b })).text, "'in b'")
  assert.equal((await sbx.runCode('import os; os.getcwd()', { context: b })).text, "'/tmp'")
  // The default context does not see either.
  assert.equal((await sbx.runCode('"x" in globals()')).text, 'False')

  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id), `listed ${ids}`)

  await sbx.restartCodeContext(a)
  const gone = await sbx.runCode('x', { context: a })
  assert.equal(gone.error?.name, 'NameError')
  assert.equal((await sbx.runCode('x', { context: b })).text, "'in b'")

  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === b.id))
  await rejectsWith(sbx.runCode('1', { context: b }), 'NotFoundError')
  await sbx.removeCodeContext(a)
})

test('languages: bash runs, javascript has no kernel here (the SDK\'s NotFoundError)', async () => {
  const ex = await sbx.runCode('echo "$((6 * 7))" from bash', { language: 'bash' })
  assert.equal(ex.logs.stdout.join(''), '42 from bash\n')
  await rejectsWith(sbx.runCode('1 + 1', { language: 'javascript' }), 'NotFoundError',
    (e) => assert.match(e.message, /javascript/))
})

test('port routing: a sandbox port needs that sandbox\'s token', async () => {
  const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' }
  let r = await fetch(apiUrl + '/health', { headers })
  assert.equal(r.status, 401, 'no token')
  r = await fetch(apiUrl + '/health', { headers: { ...headers, 'E2B-Traffic-Access-Token': 'btt_forged' } })
  assert.equal(r.status, 401, 'forged traffic token')
  // Another sandbox's envd token does not open this one's port.
  const other = await raw('POST', '/v2/sandboxes', { body: { templateID: 'base', timeout: 60, metadata: md } })
  assert.equal(other.status, 201, other.text)
  try {
    r = await fetch(apiUrl + '/health', { headers: { ...headers, 'X-Access-Token': other.json.envdAccessToken } })
    assert.equal(r.status, 401, 'other sandbox token')
    r = await fetch(apiUrl + '/health', { headers: { ...headers, 'E2B-Traffic-Access-Token': other.json.trafficAccessToken } })
    assert.equal(r.status, 401, 'other sandbox traffic token')
    // The API key is a control-plane credential, not a port credential.
    r = await fetch(apiUrl + '/health', { headers: { ...headers, 'X-API-Key': opts.apiKey } })
    assert.equal(r.status, 401, 'api key')
  } finally {
    await raw('DELETE', `/sandboxes/${other.json.sandboxID}`)
  }
  r = await fetch(apiUrl + '/health', { headers: { ...headers, 'E2B-Traffic-Access-Token': sbx.trafficAccessToken } })
  assert.equal(r.status, 200)
  assert.equal(await r.text(), 'OK')
  // A port nothing listens on is E2B's 502.
  r = await fetch(apiUrl + '/', { headers: { ...headers, 'E2b-Sandbox-Port': '49998', 'E2B-Traffic-Access-Token': sbx.trafficAccessToken } })
  assert.equal(r.status, 502)
})

// A memory pause keeps the kernels' state, on both runtimes: runsc
// checkpoints the server's listening TCP socket itself; runc's CRIU
// (/var/cache/berth/bin/criu) dumps it too. The sandbox is made through
// berth's own API (the E2B SDK cannot pick a runtime) and used through the
// SDK from then on.
for (const runtime of ['runsc', 'runc']) {
  test(`pause (memory, ${runtime}) + connect: the kernel state is still there`, async () => {
    const made = await fetch(apiUrl + '/v1/sandboxes', {
      method: 'POST',
      headers: { 'X-API-Key': opts.apiKey, 'Content-Type': 'application/json' },
      body: JSON.stringify({ template: 'code-interpreter-v1', runtime, ttl: '10m', labels: md }),
    })
    const body = await made.json()
    assert.equal(made.status, 201, JSON.stringify(body))
    let s = await Sandbox.connect(body.id, { ...opts, timeoutMs: 600_000 })
    try {
      await s.runCode('import numpy as np, os\nkept = int(np.arange(10).sum())\npid_before = os.getpid()')
      assert.equal(await s.pause(), true)
      const info = await Sandbox.getInfo(body.id, opts)
      assert.equal(info.state, 'paused')
      const v1 = await (await fetch(apiUrl + '/v1/sandboxes/' + body.id, { headers: { 'X-API-Key': opts.apiKey } })).json()
      assert.equal(v1.pause_mode, 'memory', JSON.stringify(v1))
      s = await Sandbox.connect(body.id, { ...opts, timeoutMs: 600_000 })
      const ex = await s.runCode('kept, os.getpid() == pid_before')
      assert.equal(ex.error, undefined, ex.error?.traceback)
      assert.equal(ex.text, '(45, True)')
    } finally {
      await s.kill()
    }
  })
}

// envVars given at create reach runCode in a sandbox claimed from a warm
// pool, whose kernel was started before the claim (the server takes the
// sandbox's environment file in before every execution), and a call's
// own envs still win for that call only.
test('warm pool: create-time envVars reach the already-running kernel', async () => {
  const tpl = 'code-interpreter-v1'
  const v1 = async (method, path, body) => {
    const r = await fetch(apiUrl + path, {
      method, headers: { 'X-API-Key': opts.apiKey, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    const text = await r.text()
    return { status: r.status, json: text ? JSON.parse(text) : undefined, text }
  }
  const pool = async () => (await v1('GET', '/v1/pools')).json.find((p) => p.template === tpl)
  const prior = await pool()
  const set = await v1('PUT', `/v1/pools/${tpl}`, { size: 1 })
  assert.ok(set.status === 200 || set.status === 201, set.text)
  let s
  try {
    const end = Date.now() + 300_000
    for (;;) {
      const p = await pool()
      if (p?.ready >= 1 && p?.starting === 0) break
      assert.ok(Date.now() < end, `pool not ready: ${JSON.stringify(p)}`)
      await new Promise((r) => setTimeout(r, 200))
    }
    // Let the member's server start its default kernel (with the pool's
    // empty environment) before the claim.
    await new Promise((r) => setTimeout(r, 3000))
    s = await Sandbox.create({ ...opts, timeoutMs: 300_000, metadata: md, envs: { BERTH_POOL_ENV: 'claimed', BERTH_BOTH: 'create' } })
    const info = await v1('GET', `/v1/sandboxes/${s.sandboxId}`)
    assert.equal(info.json.extra?.claimed_from_pool, tpl, `not a pool hit: ${info.text}`)
    let ex = await s.runCode('import os\n(os.environ.get("BERTH_POOL_ENV"), os.environ.get("BERTH_BOTH"))')
    assert.equal(ex.error, undefined, ex.error?.traceback)
    assert.equal(ex.text, "('claimed', 'create')")
    ex = await s.runCode('os.environ.get("BERTH_BOTH")', { envs: { BERTH_BOTH: 'call' } })
    assert.equal(ex.text, "'call'")
    assert.equal((await s.runCode('os.environ.get("BERTH_BOTH")')).text, "'create'")
    ex = await s.runCode('echo "$BERTH_POOL_ENV"', { language: 'bash' })
    assert.equal(ex.logs.stdout.join(''), 'claimed\n')
    // A context made after the claim starts with it too.
    const c = await s.createCodeContext()
    assert.equal((await s.runCode('import os; os.environ.get("BERTH_POOL_ENV")', { context: c })).text, "'claimed'")
    // And a command through envd (the agent reads the same file).
    assert.equal((await s.commands.run('echo $BERTH_POOL_ENV')).stdout, 'claimed\n')
  } finally {
    await s?.kill()
    if (prior) {
      await v1('PUT', `/v1/pools/${tpl}`, { size: prior.size, runtime: prior.runtime })
    } else {
      await v1('DELETE', `/v1/pools/${tpl}`)
    }
  }
})

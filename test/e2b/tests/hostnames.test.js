// Sandbox host names (issue 15 item 3) with SDK 2.51.0 and NO E2B_SANDBOX_URL:
// envd is https://49983-<id>.<domain> and sbx.getHost(port) is
// <port>-<id>.<domain>, served by `berth serve --sandbox-domain` over TLS
// with berth's CA (run.sh sets NODE_EXTRA_CA_CERTS to `berth ca`'s output
// and BERTH_SANDBOX_DOMAIN to the domain; *.localhost resolves to loopback
// through libnss-myhostname). Only E2B_API_URL and E2B_API_KEY are set: the
// domain comes from the create response.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { opts as baseOpts, runId, raw, sleep } from './env.js'

// env.js points every other suite at E2B_SANDBOX_URL; this file (its own
// process under node --test) must not see it.
delete process.env.E2B_SANDBOX_URL
delete process.env.E2B_DOMAIN
const { Sandbox } = await import('e2b')
const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter')
const { sandboxUrl: _unused, ...opts } = baseOpts

const domain = process.env.BERTH_SANDBOX_DOMAIN
if (!domain) throw new Error('set BERTH_SANDBOX_DOMAIN (run.sh serves --sandbox-domain)')

const made = []
async function create(suite, extra = {}) {
  const sbx = await Sandbox.create('base', { ...opts, timeoutMs: 600_000, metadata: { run: runId, suite }, ...extra })
  made.push(sbx)
  return sbx
}
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

// startWeb serves a page from the sandbox on port and waits until it answers
// from inside.
async function startWeb(sbx, port, text) {
  await sbx.files.write(`/home/user/www${port}/index.html`, text)
  await sbx.commands.run(`cd /home/user/www${port} && exec python3 -m http.server ${port} --bind 0.0.0.0`, { background: true })
  for (let i = 0; i < 100; i++) {
    const r = await sbx.commands.run(`python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:${port}/').read().decode())"`).catch((e) => e)
    if (r?.exitCode === 0) return
    await sleep(200)
  }
  throw new Error(`web server on ${port} did not start`)
}

async function get(url, headers = {}) {
  const res = await fetch(url, { headers, signal: AbortSignal.timeout(120_000) })
  return { status: res.status, text: await res.text() }
}

test('hostnames: envd through https://49983-<id>.<domain> with no E2B_SANDBOX_URL (commands, files)', async () => {
  assert.equal(process.env.E2B_SANDBOX_URL, undefined)
  const sbx = await create('envd')
  assert.equal(sbx.sandboxDomain, domain)
  assert.equal(sbx.envdApiUrl, `https://49983-${sbx.sandboxId}.${domain}`)
  await sbx.files.write('/home/user/hello.txt', 'over host names')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'over host names')
  const r = await sbx.commands.run('cat /home/user/hello.txt; echo; id -un')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'over host names\nuser\n')
  assert.ok(await sbx.isRunning())
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('hello.txt'), names.join(','))
})

test('hostnames: a web server in the sandbox is fetched through getHost(port) over HTTPS; others are refused', async () => {
  const sbx = await create('web')
  await startWeb(sbx, 8000, 'hello from the sandbox')
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
  const url = `https://${host}/`
  assert.ok(sbx.trafficAccessToken, 'create answered a trafficAccessToken')

  // The sandbox's traffic token (as E2B's docs send it), its envd token,
  // the owner's API key: let through.
  for (const [name, h] of Object.entries({
    traffic: { 'e2b-traffic-access-token': sbx.trafficAccessToken },
    envd: { 'X-Access-Token': sbx.envdAccessToken },
    owner: { 'X-API-KEY': opts.apiKey },
  })) {
    const r = await get(url, h)
    assert.equal(r.status, 200, `${name}: ${r.text}`)
    assert.equal(r.text, 'hello from the sandbox', name)
  }

  // No credentials, another owner's key, another sandbox's token: refused.
  const other = await raw('POST', '/v1/keys', { body: { owner: `h${runId}` } })
  assert.equal(other.status, 201, other.text)
  const sbx2 = await create('web2')
  for (const [name, h] of Object.entries({
    none: {},
    otherOwner: { 'X-API-KEY': other.json.key },
    otherSandbox: { 'e2b-traffic-access-token': sbx2.trafficAccessToken },
    forged: { 'e2b-traffic-access-token': 'btt_0000' },
  })) {
    const r = await get(url, h)
    assert.equal(r.status, 401, `${name}: ${r.status} ${r.text}`)
    assert.doesNotMatch(r.text, /hello from the sandbox/)
  }
  // The other owner cannot reach the sandbox's envd by host name either.
  const envd = await get(`https://49983-${sbx.sandboxId}.${domain}/files?path=/home/user/www8000/index.html`, { 'X-API-KEY': other.json.key })
  assert.equal(envd.status, 401, envd.text)

  // A malformed host label names the field.
  const bad = await get(`https://99999-${sbx.sandboxId}.${domain}/`, { 'X-API-KEY': opts.apiKey })
  assert.equal(bad.status, 400)
  assert.match(bad.text, /host/)
})

test('hostnames: network.allowPublicTraffic: true opens getHost(port) without credentials; envd and the default sandbox stay private', async () => {
  const pub = await create('public', { network: { allowPublicTraffic: true } })
  const priv = await create('private')
  await startWeb(pub, 8003, 'public page')
  await startWeb(priv, 8004, 'private page')
  assert.equal((await Sandbox.getInfo(pub.sandboxId, opts)).network?.allowPublicTraffic, true)
  assert.equal((await Sandbox.getInfo(priv.sandboxId, opts)).network?.allowPublicTraffic, false)

  // A plain fetch, as a browser would: no headers at all.
  const res = await fetch(`https://${pub.getHost(8003)}/`, { signal: AbortSignal.timeout(120_000) })
  const text = await res.text()
  assert.equal(res.status, 200, text)
  assert.equal(text, 'public page')

  // envd of the public sandbox still needs its token.
  const envd = await get(`https://49983-${pub.sandboxId}.${domain}/files?path=/home/user/www8003/index.html`)
  assert.equal(envd.status, 401, envd.text)
  // The default sandbox is private: 401, and the public one's tokens do not open it.
  for (const [name, h] of Object.entries({
    none: {},
    publicsToken: { 'e2b-traffic-access-token': pub.trafficAccessToken },
  })) {
    const r = await get(`https://${priv.getHost(8004)}/`, h)
    assert.equal(r.status, 401, `${name}: ${r.status} ${r.text}`)
    assert.doesNotMatch(r.text, /private page/)
  }
  // E2B egress rules are not berth's: refused naming the field.
  await assert.rejects(create('rules', { network: { allowPublicTraffic: true, denyOut: ['0.0.0.0/0'] } }), /network\.denyOut/)
})

test('hostnames: a paused autoResume sandbox answers a getHost fetch after resuming; without autoResume it is the 502 of a paused sandbox', async () => {
  const auto = await create('auto', { lifecycle: { onTimeout: 'pause', autoResume: true } })
  const plain = await create('plain')
  await startWeb(auto, 8001, 'resumed and serving')
  await startWeb(plain, 8002, 'should not answer')
  const h = { 'X-API-KEY': opts.apiKey }

  assert.equal(await auto.pause(), true)
  assert.equal(await plain.pause(), true)
  assert.equal((await Sandbox.getInfo(auto.sandboxId, opts)).state, 'paused')

  const r = await get(`https://${auto.getHost(8001)}/`, h)
  assert.equal(r.status, 200, r.text)
  assert.equal(r.text, 'resumed and serving')
  assert.equal((await Sandbox.getInfo(auto.sandboxId, opts)).state, 'running')

  const p = await get(`https://${plain.getHost(8002)}/`, h)
  assert.equal(p.status, 502, p.text)
  const body = JSON.parse(p.text)
  assert.equal(body.code, 502)
  assert.equal(body.sandboxId, plain.sandboxId)
  assert.equal((await Sandbox.getInfo(plain.sandboxId, opts)).state, 'paused')
})

test('hostnames: only E2B_DOMAIN and E2B_API_KEY set: the control plane is https://api.<domain>', async () => {
  const saved = process.env.E2B_API_URL
  delete process.env.E2B_API_URL
  process.env.E2B_DOMAIN = domain
  try {
    const sbx = await Sandbox.create('base', { apiKey: opts.apiKey, requestTimeoutMs: 120_000, timeoutMs: 600_000, metadata: { run: runId, suite: 'domain' } })
    made.push(sbx)
    assert.equal(sbx.connectionConfig.apiUrl, `https://api.${domain}`)
    assert.equal(sbx.envdApiUrl, `https://49983-${sbx.sandboxId}.${domain}`)
    const r = await sbx.commands.run('echo only-domain')
    assert.equal(r.stdout, 'only-domain\n')
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, { apiKey: opts.apiKey })).sandboxId, sbx.sandboxId)
    assert.equal(await sbx.kill(), true)
  } finally {
    process.env.E2B_API_URL = saved
    delete process.env.E2B_DOMAIN
  }
})

test('hostnames: @e2b/code-interpreter runCode through https://49999-<id>.<domain> with no E2B_SANDBOX_URL', async () => {
  const sbx = await CodeSandbox.create({ ...opts, timeoutMs: 600_000, metadata: { run: runId, suite: 'ci' } })
  made.push(sbx)
  assert.equal(sbx.jupyterUrl, `https://49999-${sbx.sandboxId}.${domain}`)
  await sbx.runCode('x = 41')
  const ex = await sbx.runCode('x + 1')
  assert.equal(ex.error, undefined)
  assert.equal(ex.text, '42')
})

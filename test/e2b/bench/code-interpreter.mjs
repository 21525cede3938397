// Code-interpreter figures through the unmodified @e2b/code-interpreter SDK:
//   tti-cold  clock starts before Sandbox.create() (template
//             code-interpreter-v1, no warm pool) and stops when
//             runCode('1+1') has returned text "2"; kill is outside the clock.
//   tti-warm  the same with a warm pool of 3 on code-interpreter-v1 (server
//             default runtime and resources), refilled to 3 and settled 3 s
//             (the members' kernels started) outside the clock before every
//             create; a create not claimed from the pool is a failed sample.
//   rtt       runCode('1+1') on a running sandbox whose kernel has answered
//             once: from the POST /execute to the end of the stream.
// Run against a server with the template (e.g. after test/e2b/run.sh set it up):
//   BERTH_URL=http://127.0.0.1:7070 BERTH_API_KEY=... node bench/code-interpreter.mjs [runs]
import { Sandbox } from '@e2b/code-interpreter'

const url = process.env.BERTH_URL
const apiKey = process.env.BERTH_API_KEY
if (!url || !apiKey) throw new Error('set BERTH_URL and BERTH_API_KEY')
const opts = { apiUrl: url, sandboxUrl: url, apiKey, requestTimeoutMs: 120_000 }
const runs = Number(process.argv[2] || 10)
const template = 'code-interpreter-v1'

const api = async (method, path, body) => {
  const r = await fetch(url + path, {
    method, headers: { 'X-API-Key': apiKey, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await r.text()
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`)
  return text ? JSON.parse(text) : null
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]
}
const summary = (name, xs, failed = 0) =>
  console.log(`${name}: n=${xs.length} p50=${pct(xs, 50).toFixed(1)} ms p99=${pct(xs, 99).toFixed(1)} ms min=${Math.min(...xs).toFixed(1)} ms` +
    (failed ? ` failed=${failed}` : ''))

async function tti() {
  const t0 = performance.now()
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 120_000 })
  const ex = await sbx.runCode('1+1')
  const ms = performance.now() - t0
  if (ex.text !== '2') throw new Error(`runCode('1+1') = ${JSON.stringify(ex.text)}`)
  return { ms, sbx }
}

async function waitPool(n) {
  for (let i = 0; i < 600; i++) {
    const p = (await api('GET', '/v1/pools')).find((x) => x.template === template)
    if (p && p.ready >= n) return
    await sleep(100)
  }
  throw new Error('pool did not refill')
}

await api('DELETE', `/v1/pools/${template}`).catch(() => {})
// One unmeasured create warms the page cache of the template's layers.
;(await tti()).sbx.kill()

const cold = []
for (let i = 0; i < runs; i++) {
  const { ms, sbx } = await tti()
  cold.push(ms)
  await sbx.kill()
}
summary('code-interpreter tti-cold', cold)

await api('PUT', `/v1/pools/${template}`, { size: 3 })
const warm = []
let misses = 0
try {
  for (let i = 0; i < runs; i++) {
    await waitPool(3)
    await sleep(3000)
    const { ms, sbx } = await tti()
    const info = await api('GET', `/v1/sandboxes/${sbx.sandboxId}`)
    if (info.extra?.claimed_from_pool) warm.push(ms)
    else misses++
    await sbx.kill()
  }
} finally {
  await api('DELETE', `/v1/pools/${template}`).catch(() => {})
}
summary('code-interpreter tti-warm', warm, misses)

const sbx = await Sandbox.create({ ...opts, timeoutMs: 120_000 })
try {
  await sbx.runCode('1+1')
  const rtt = []
  for (let i = 0; i < Math.max(50, runs); i++) {
    const t0 = performance.now()
    const ex = await sbx.runCode('1+1')
    rtt.push(performance.now() - t0)
    if (ex.text !== '2') throw new Error('bad result')
  }
  summary('code-interpreter runCode rtt', rtt)
} finally {
  await sbx.kill()
}

// Connection settings for the suite: BERTH_URL and BERTH_API_KEY (set by
// ../run.sh), or the SDK's own E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY.
import assert from 'node:assert/strict'

const url = process.env.BERTH_URL || process.env.E2B_API_URL
const apiKey = process.env.BERTH_API_KEY || process.env.E2B_API_KEY
if (!url || !apiKey) {
  throw new Error('set BERTH_URL and BERTH_API_KEY (or E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY); see run.sh')
}
process.env.E2B_API_URL = url
process.env.E2B_SANDBOX_URL = process.env.E2B_SANDBOX_URL || url
process.env.E2B_API_KEY = apiKey

export const apiUrl = url
export const opts = { apiUrl: url, sandboxUrl: process.env.E2B_SANDBOX_URL, apiKey, requestTimeoutMs: 120_000 }

// createOpts are options for Sandbox.create; every sandbox gets a run label
// so list tests only see their own.
export const runId = `r${Date.now().toString(36)}`

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

// rejectsWith asserts that p rejects with an instance of cls (by name, so
// classes from different SDK copies compare equal).
export async function rejectsWith(p, name, check) {
  await assert.rejects(p, (err) => {
    // Accept subclasses: 2.51 raises FileNotFoundError (a NotFoundError) for files.
    const chain = []
    for (let c = err?.constructor; c && c.name; c = Object.getPrototypeOf(c)) chain.push(c.name)
    assert.ok(chain.includes(name), `want ${name}, got ${chain.join(' < ')}: ${err?.message}`)
    if (check) check(err)
    return true
  })
}

// raw issues a control-plane request without the SDK.
export async function raw(method, path, { key = apiKey, body, headers = {} } = {}) {
  const h = { ...headers }
  if (key) h['X-API-KEY'] = key
  if (body !== undefined) h['Content-Type'] = 'application/json'
  const res = await fetch(url + path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) })
  const text = await res.text()
  let json
  try { json = text ? JSON.parse(text) : undefined } catch { json = undefined }
  return { status: res.status, headers: res.headers, text, json }
}

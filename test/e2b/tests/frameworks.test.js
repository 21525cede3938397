// Agent frameworks' published E2B providers, unmodified, against berth with
// only the E2B environment variables set (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY: env.js sets them from run.sh's BERTH_URL / BERTH_API_KEY).
// Neither provider is given a URL or a key in code.
//   @mastra/e2b 0.8.0     E2BSandbox (a Mastra workspace sandbox)
//   @computesdk/e2b 1.7.52 the ComputeSDK provider factory e2b(), directly
//                          and through computesdk 4.1.4's compute manager
// Both drive the e2b SDK (2.51.0, deduplicated in node_modules).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { runId, raw } from './env.js'
import { E2BSandbox } from '@mastra/e2b'
import { e2b as computeE2B } from '@computesdk/e2b'
import { compute } from 'computesdk'

// gone asserts that berth no longer has the sandbox (or only as killed).
async function assertGone(id) {
  const r = await raw('GET', `/sandboxes/${id}`)
  assert.equal(r.status, 404, `sandbox ${id} after destroy: ${r.status} ${r.text}`)
}

// Mastra's E2BSandbox with no template builds a "mountable" template
// (base + apt-get install s3fs fuse) through E2B's template-build API, which
// berth does not serve (and whose apt step needs the internet); a named
// template is the provider's documented alternative and what is used here.
test('@mastra/e2b: start, executeCommand, files, background process, stop + reconnect, destroy', async () => {
  const logical = `berth-${runId}-mastra`
  const sbx = new E2BSandbox({
    id: logical, template: 'base', timeout: 300_000,
    env: { BERTH_FW: 'from-mastra' }, metadata: { run: runId, suite: 'frameworks' },
  })
  await sbx.start()
  try {
    assert.equal(sbx.status, 'running')
    const id = sbx.e2b.sandboxId
    const info = await raw('GET', `/sandboxes/${id}`)
    assert.equal(info.status, 200, info.text)
    assert.equal(info.json.metadata['mastra-sandbox-id'], logical)
    assert.equal(info.json.templateID, 'base')

    // executeCommand goes through the provider's process manager (a
    // background commands.run with stdin) and waits for the exit.
    let r = await sbx.executeCommand('echo', ['hello', 'from mastra'])
    assert.equal(r.exitCode, 0, r.stderr)
    assert.equal(r.stdout, 'hello from mastra\n')
    r = await sbx.executeCommand('sh -c "echo $BERTH_FW; echo oops >&2; exit 3"')
    assert.equal(r.exitCode, 3)
    assert.equal(r.success, false)
    // On a non-zero exit the provider's wait() emits the CommandExitError's
    // stdout/stderr again on top of what it streamed (its own behaviour,
    // the same against E2B), so each stream is there twice.
    assert.equal(r.stdout, 'from-mastra\n'.repeat(2))
    assert.equal(r.stderr, 'oops\n'.repeat(2))
    r = await sbx.executeCommand('pwd', [], { cwd: '/tmp' })
    assert.equal(r.stdout, '/tmp\n')

    // writeFiles is the provider's bulk upload; read back both ways.
    await sbx.writeFiles([
      { path: '/tmp/mastra/a.txt', content: 'alpha' },
      { path: '/tmp/mastra/b.bin', content: Buffer.from([0, 1, 2, 255]) },
    ])
    assert.equal(await sbx.e2b.files.read('/tmp/mastra/a.txt'), 'alpha')
    r = await sbx.executeCommand('od -An -tu1 /tmp/mastra/b.bin')
    assert.equal(r.stdout.trim().split(/\s+/).join(','), '0,1,2,255')

    // A long-running process: spawn, feed stdin, list, wait.
    const h = await sbx.processes.spawn('read line; echo "got $line"')
    assert.match(h.pid, /^\d+$/)
    const listed = await sbx.processes.list()
    assert.ok(listed.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(listed)}`)
    await h.sendStdin('berth\n')
    const done = await h.wait()
    assert.equal(done.exitCode, 0)
    assert.equal(done.stdout, 'got berth\n')

    // stop() pauses; a new E2BSandbox with the same logical id finds it by
    // metadata (Sandbox.list with a state filter) and resumes it: the disk
    // (and so the file) is still there.
    await sbx.stop()
    const paused = await raw('GET', `/sandboxes/${id}`)
    assert.equal(paused.json.state, 'paused', paused.text)
    const again = new E2BSandbox({ id: logical, template: 'base' })
    await again.start()
    assert.equal(again.e2b.sandboxId, id, 'reconnected to the same sandbox')
    r = await again.executeCommand('cat /tmp/mastra/a.txt')
    assert.equal(r.stdout, 'alpha')
    await again.destroy()
    await assertGone(id)
  } finally {
    // Whatever the outcome, leave nothing behind.
    const left = await raw('GET', `/v2/sandboxes?metadata=${encodeURIComponent(`mastra-sandbox-id=${logical}`)}&state=running,paused`)
    for (const s of left.json ?? []) await raw('DELETE', `/sandboxes/${s.sandboxID}`)
  }
})

test('@computesdk/e2b: create, runCommand, filesystem, getById, list, destroy', async () => {
  const provider = computeE2B({})
  const sbx = await provider.sandbox.create({ metadata: { run: runId, suite: 'frameworks' }, envs: { BERTH_FW: 'from-computesdk' } })
  const id = sbx.sandboxId
  try {
    const info = await raw('GET', `/sandboxes/${id}`)
    assert.equal(info.status, 200, info.text)
    assert.equal(info.json.metadata.suite, 'frameworks')

    let r = await sbx.runCommand('echo $BERTH_FW; uname -s')
    assert.equal(r.exitCode, 0, r.stderr)
    assert.equal(r.stdout, 'from-computesdk\nLinux\n')
    // The provider prefixes the command with X="..." (so it applies to the
    // first simple command) and cd's first.
    r = await sbx.runCommand('sh -c \'pwd; echo "$X"\'', { cwd: '/tmp', env: { X: 'it\'s "quoted"' } })
    assert.equal(r.stdout, '/tmp\nit\'s "quoted"\n')
    r = await sbx.runCommand('echo bad >&2; exit 7')
    assert.equal(r.exitCode, 7)
    assert.equal(r.stderr, 'bad\n')

    await sbx.filesystem.mkdir('/tmp/csdk/sub')
    await sbx.filesystem.writeFile('/tmp/csdk/hello.txt', 'hi from computesdk')
    assert.equal(await sbx.filesystem.readFile('/tmp/csdk/hello.txt'), 'hi from computesdk')
    assert.equal(await sbx.filesystem.exists('/tmp/csdk/hello.txt'), true)
    const entries = await sbx.filesystem.readdir('/tmp/csdk')
    const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
    assert.equal(byName['hello.txt']?.type, 'file')
    assert.equal(byName['hello.txt']?.size, 18)
    // The provider maps entry.isDir / isDirectory, which the e2b 2.x SDK's
    // EntryInfo does not have (it has type: 'dir'), so it calls every entry
    // a file; the underlying SDK instance shows the directory.
    assert.ok(byName.sub, `readdir: ${JSON.stringify(entries)}`)
    const raw2 = await sbx.getInstance().files.list('/tmp/csdk')
    assert.equal(raw2.find((e) => e.name === 'sub')?.type, 'dir')
    r = await sbx.runCommand('cat /tmp/csdk/hello.txt')
    assert.equal(r.stdout, 'hi from computesdk')
    await sbx.filesystem.remove('/tmp/csdk/hello.txt')
    assert.equal(await sbx.filesystem.exists('/tmp/csdk/hello.txt'), false)

    const url = await sbx.getUrl({ port: 8080 })
    assert.match(url, new RegExp(`^https://8080-${id}\\.`))

    // getById connects anew (Sandbox.connect with only the key).
    const byId = await provider.sandbox.getById(id)
    assert.ok(byId, 'getById found the sandbox')
    assert.equal((await byId.runCommand('cat /proc/1/comm >/dev/null && echo up')).stdout, 'up\n')
    const listed = await provider.sandbox.list()
    assert.ok(listed.some((s) => s.sandboxId === id), `list: ${listed.map((s) => s.sandboxId)}`)

    await sbx.destroy()
    await assertGone(id)
    assert.equal(await provider.sandbox.getById(id), null)
  } finally {
    await raw('DELETE', `/sandboxes/${id}`)
  }
})

// The README's way: the compute manager configured with the provider;
// a snapshot of a sandbox (E2B's createSnapshot, berth's snapshot) starts a
// new sandbox with the file in it.
test('computesdk: compute.setConfig({provider: e2b()}), snapshot, create from the snapshot', async () => {
  compute.setConfig({ provider: computeE2B({}) })
  const made = []
  let snap
  try {
    const a = await compute.sandbox.create({ metadata: { run: runId, suite: 'frameworks' } })
    made.push(a.sandboxId)
    assert.equal((await a.runCommand('echo snapshot-me > /tmp/kept.txt && echo ok')).stdout, 'ok\n')
    snap = await compute.snapshot.create(a.sandboxId, { name: `fw-${runId}` })
    assert.ok(snap.id, `snapshot ${JSON.stringify(snap)}`)
    const b = await compute.sandbox.create({ snapshotId: snap.id, metadata: { run: runId, suite: 'frameworks' } })
    made.push(b.sandboxId)
    assert.notEqual(b.sandboxId, a.sandboxId)
    assert.equal(await b.filesystem.readFile('/tmp/kept.txt'), 'snapshot-me\n')
    // The two are separate machines: a write in one is not in the other.
    await b.filesystem.writeFile('/tmp/only-b.txt', 'b')
    assert.equal(await a.filesystem.exists('/tmp/only-b.txt'), false)
    await b.destroy()
    await a.destroy()
    for (const id of made) await assertGone(id)
  } finally {
    for (const id of made) await raw('DELETE', `/sandboxes/${id}`)
    if (snap?.id) await raw('DELETE', `/templates/${encodeURIComponent(snap.id)}`)
  }
})

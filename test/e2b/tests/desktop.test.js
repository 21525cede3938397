// @e2b/desktop 2.4.0, unmodified, against berth's desktop template
// (templates/desktop): Sandbox.create() asks for template "desktop" and then
// drives everything through commands.run (Xvfb, startxfce4, xdotool, scrot,
// xrandr, xdg-open, gtk-launch, x11vnc + noVNC). Commands and files go
// through E2B_SANDBOX_URL (env.js); the VNC stream's URL is the SDK's own
// getHost(6080) = https://6080-<id>.<domain>/vnc.html, fetched over TLS with
// berth's CA trusted (run.sh: NODE_EXTRA_CA_CERTS, --sandbox-domain).
// run.sh builds (or imports from the host cache) the template first.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import tls from 'node:tls'
import { inflateSync } from 'node:zlib'
import { Sandbox } from '@e2b/desktop'
import { opts, runId, sleep } from './env.js'

const md = { run: runId, suite: 'desktop' }
const domain = process.env.BERTH_SANDBOX_DOMAIN
// The SDK's URLs carry no port (443). run.sh may serve the sandbox TLS
// listener elsewhere (BERTH_E2B_TLS_LISTEN): then the same URL, Host and SNI
// are used, only the TCP port differs.
const tlsPort = process.env.BERTH_SANDBOX_TLS_PORT || ''
const W = 1280
const H = 800

const made = []
async function create() {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000, metadata: md, resolution: [W, H] })
  made.push(sbx)
  return sbx
}

let sbx
let createToShotMs
before(async () => {
  const t0 = performance.now()
  sbx = await create()
  await sbx.screenshot()
  createToShotMs = performance.now() - t0
})

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

// decodePNG parses a PNG (8-bit RGB or RGBA, not interlaced: what scrot
// writes) into its size and raw pixels, checking the signature, the chunk
// layout and every scanline filter.
function decodePNG(buf) {
  assert.ok(buf.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'PNG signature')
  let off = 8
  let ihdr
  const idat = []
  for (;;) {
    assert.ok(off + 12 <= buf.length, 'truncated PNG')
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    const data = buf.subarray(off + 8, off + 8 + len)
    off += 12 + len
    if (type === 'IHDR') ihdr = data
    else if (type === 'IDAT') idat.push(data)
    else if (type === 'IEND') break
  }
  assert.ok(ihdr, 'IHDR')
  const width = ihdr.readUInt32BE(0)
  const height = ihdr.readUInt32BE(4)
  const depth = ihdr[8]
  const colour = ihdr[9]
  assert.equal(depth, 8, 'bit depth')
  assert.ok(colour === 2 || colour === 6, `colour type ${colour}`)
  assert.equal(ihdr[12], 0, 'not interlaced')
  const bpp = colour === 6 ? 4 : 3
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * bpp
  assert.equal(raw.length, height * (stride + 1), 'image data size')
  const px = Buffer.alloc(height * stride)
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const cur = y * stride
    const prev = cur - stride
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? px[cur + x - bpp] : 0
      const b = y > 0 ? px[prev + x] : 0
      const c = x >= bpp && y > 0 ? px[prev + x - bpp] : 0
      let v
      switch (f) {
        case 0: v = line[x]; break
        case 1: v = line[x] + a; break
        case 2: v = line[x] + b; break
        case 3: v = line[x] + ((a + b) >> 1); break
        case 4: {
          const p = a + b - c
          const pa = Math.abs(p - a)
          const pb = Math.abs(p - b)
          const pc = Math.abs(p - c)
          v = line[x] + (pa <= pb && pa <= pc ? a : pb <= pc ? b : c)
          break
        }
        default: assert.fail(`scanline ${y}: filter ${f}`)
      }
      px[cur + x] = v & 0xff
    }
  }
  return { width, height, bpp, px }
}

function colours(img) {
  const seen = new Set()
  for (let i = 0; i < img.px.length; i += img.bpp) {
    seen.add((img.px[i] << 16) | (img.px[i + 1] << 8) | img.px[i + 2])
    if (seen.size > 1000) break
  }
  return seen.size
}

test('desktop: create asks for template "desktop" and starts Xvfb + XFCE at the requested resolution', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'desktop')
  assert.deepEqual(await sbx.getScreenSize(), { width: W, height: H })
  const r = await sbx.commands.run('pgrep -x xfce4-session && pgrep -x xfwm4 && pgrep -x xfdesktop && echo "$DISPLAY"')
  assert.match(r.stdout, /:0\n$/)
  console.log(`desktop create -> first screenshot: ${createToShotMs.toFixed(0)} ms`)
})

test('desktop: screenshot is a real PNG of the configured size, and not one colour', async () => {
  const png = Buffer.from(await sbx.screenshot())
  const img = decodePNG(png)
  assert.equal(img.width, W)
  assert.equal(img.height, H)
  const n = colours(img)
  assert.ok(n > 10, `only ${n} distinct colours: the desktop did not draw`)
})

test('desktop: mouse move + click, keyboard write + ctrl+s in mousepad; the text is read back via files', async () => {
  const path = '/home/user/berth-note.txt'
  await sbx.files.write(path, '')
  await sbx.launch('org.xfce.mousepad', path)
  let win = ''
  for (let i = 0; i < 120 && !win; i++) {
    const r = await sbx.commands.run('xdotool search --onlyvisible --class mousepad', { user: 'user' }).catch(() => null)
    win = r?.stdout.trim().split('\n').pop() || ''
    if (!win) await sleep(500)
  }
  assert.ok(win, 'no mousepad window within 60 s')
  // The middle of the window is its text view.
  const g = (await sbx.commands.run(`xdotool getwindowgeometry --shell ${win}`)).stdout
  const v = Object.fromEntries(g.trim().split('\n').map((l) => l.split('=')))
  const x = Number(v.X) + Math.floor(Number(v.WIDTH) / 2)
  const y = Number(v.Y) + Math.floor(Number(v.HEIGHT) / 2)
  await sbx.moveMouse(x, y)
  assert.deepEqual(await sbx.getCursorPosition(), { x, y })
  await sbx.leftClick()
  assert.equal(await sbx.getCurrentWindowId(), win, 'the click focused mousepad')
  const text = `typed by @e2b/desktop on berth ${runId}`
  await sbx.write(text)
  await sbx.press('enter')
  await sbx.write('second line')
  await sbx.press(['ctrl', 's'])
  let got = ''
  for (let i = 0; i < 40; i++) {
    got = await sbx.files.read(path)
    if (got.includes('second line')) break
    await sleep(250)
  }
  assert.equal(got.replace(/\n$/, ''), `${text}\nsecond line`)
  assert.match(await sbx.getWindowTitle(win), /berth-note\.txt/)
  await sbx.commands.run('pkill -x mousepad').catch(() => {})
})

test('desktop: open(url) shows the page in the browser', async () => {
  const title = `berth-open-${runId}`
  await sbx.files.write('/home/user/www/index.html', `<html><head><title>${title}</title></head><body>hello</body></html>`)
  await sbx.commands.run('cd /home/user/www && exec python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  for (let i = 0; i < 100; i++) {
    const r = await sbx.commands.run('python3 -c "import urllib.request as u; u.urlopen(\'http://127.0.0.1:8000/\')"').catch((e) => e)
    if (r?.exitCode === 0) break
    await sleep(200)
  }
  await sbx.open('http://127.0.0.1:8000/')
  // The browser's windows by class (the SDK's getApplicationWindows), then
  // their titles (getWindowTitle): xdotool's --name search misses titles
  // that are not Latin-1, as Firefox's " — Mozilla Firefox" suffix is.
  let titles = []
  for (let i = 0; i < 180 && !titles.some((t) => t.includes(title)); i++) {
    if (i > 0) await sleep(500)
    const ids = await sbx.getApplicationWindows('firefox').catch(() => [])
    titles = []
    for (const id of ids.filter(Boolean)) titles.push(await sbx.getWindowTitle(id).catch(() => ''))
  }
  assert.ok(titles.some((t) => t.includes(title)), `no browser window titled ${title} within 90 s: ${JSON.stringify(titles)}`)
  await sbx.commands.run('pkill -f firefox-esr').catch(() => {})
})

// get fetches url over TLS with NODE_EXTRA_CA_CERTS trusted (node's default
// verification: the leaf must be for this very host name).
async function get(url, headers = {}) {
  const u = new URL(url)
  if (tlsPort) u.port = tlsPort
  const res = await fetch(u, { headers, signal: AbortSignal.timeout(60_000) })
  return { status: res.status, text: await res.text() }
}

// rfbHello opens noVNC's WebSocket (/websockify, as vnc.html does) through
// the host name and returns the first bytes of the VNC server's greeting.
function rfbHello(host, headers) {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host, port: Number(tlsPort || 443), servername: host, ALPNProtocols: ['http/1.1'] }, () => {
      const h = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')
      s.write(`GET /websockify HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: ${Buffer.from('berth-desktop-16').toString('base64')}\r\nSec-WebSocket-Version: 13\r\n` +
        `Sec-WebSocket-Protocol: binary\r\n${h}\r\n`)
    })
    let buf = Buffer.alloc(0)
    const timer = setTimeout(() => { s.destroy(); reject(new Error(`no RFB greeting: ${buf.toString('latin1')}`)) }, 30_000)
    s.on('data', (d) => {
      buf = Buffer.concat([buf, d])
      const end = buf.indexOf('\r\n\r\n')
      if (end < 0) return
      const head = buf.subarray(0, end).toString('latin1')
      if (!/^HTTP\/1\.1 101/.test(head)) { clearTimeout(timer); s.destroy(); resolve({ head, payload: '' }); return }
      const frame = buf.subarray(end + 4)
      if (frame.length < 2) return
      const len = frame[1] & 0x7f // the greeting is 12 bytes: one short unmasked frame
      if (frame.length < 2 + len) return
      clearTimeout(timer)
      s.destroy()
      resolve({ head, payload: frame.subarray(2, 2 + len).toString('latin1') })
    })
    s.on('error', (e) => { clearTimeout(timer); reject(e) })
  })
}

test('desktop: stream.start() serves noVNC at getUrl() = https://6080-<id>.<domain>/vnc.html, and its WebSocket reaches x11vnc', async () => {
  assert.ok(domain, 'set BERTH_SANDBOX_DOMAIN (run.sh serves --sandbox-domain)')
  await sbx.stream.start()
  const url = sbx.stream.getUrl()
  assert.equal(url, `https://6080-${sbx.sandboxId}.${domain}/vnc.html?autoconnect=true&resize=scale`)
  // berth's ports are private by default: the sandbox's traffic token lets the viewer in.
  const auth = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  const page = await get(url, auth)
  assert.equal(page.status, 200, page.text.slice(0, 200))
  assert.match(page.text, /<title>noVNC<\/title>/)
  const none = await get(url)
  assert.equal(none.status, 401, 'no credential: refused')
  assert.doesNotMatch(none.text, /noVNC/)

  const host = new URL(url).hostname
  const ws = await rfbHello(host, auth)
  assert.match(ws.head, /^HTTP\/1\.1 101/, ws.head)
  assert.match(ws.payload, /^RFB 003\.00\d\n/)
  const wsNone = await rfbHello(host, {})
  assert.match(wsNone.head, /^HTTP\/1\.1 401/, wsNone.head)

  await sbx.stream.stop()
  // stop() signals x11vnc and returns; the process may take a moment to go.
  let r
  for (let i = 0; i < 50; i++) {
    r = await sbx.commands.run('pgrep -x x11vnc').catch((e) => e)
    if (r.exitCode !== 0) break
    await new Promise((res) => setTimeout(res, 100))
  }
  assert.notEqual(r.exitCode, 0, 'x11vnc still running 5 s after stream.stop()')
})

test('desktop: with network.allowPublicTraffic: true a browser opens getUrl() without any credential; envd stays private', async () => {
  const pub = await Sandbox.create({ ...opts, timeoutMs: 600_000, metadata: md, resolution: [W, H], network: { allowPublicTraffic: true } })
  made.push(pub)
  await pub.stream.start()
  const url = pub.stream.getUrl()
  const page = await get(url)
  assert.equal(page.status, 200, page.text.slice(0, 200))
  assert.match(page.text, /<title>noVNC<\/title>/)
  const ws = await rfbHello(new URL(url).hostname, {})
  assert.match(ws.head, /^HTTP\/1\.1 101/, ws.head)
  assert.match(ws.payload, /^RFB 003\.00\d\n/)
  const envd = await get(`https://49983-${pub.sandboxId}.${domain}/files?path=/etc/hostname`)
  assert.equal(envd.status, 401, envd.text)
  await pub.kill()
})

// The closing note's figure: create -> first screenshot, p50 over
// DESKTOP_RUNS creates (default 3, including the one above).
test('desktop: figure: create -> first screenshot, p50', async () => {
  const runs = Number(process.env.DESKTOP_RUNS || 3)
  const ms = [createToShotMs]
  for (let i = 1; i < runs; i++) {
    const t0 = performance.now()
    const s = await create()
    const png = decodePNG(Buffer.from(await s.screenshot()))
    ms.push(performance.now() - t0)
    assert.equal(png.width, W)
    await s.kill()
  }
  ms.sort((a, b) => a - b)
  const p50 = ms[Math.floor((ms.length - 1) / 2)]
  console.log(`FIGURE desktop create -> first screenshot: p50 ${p50.toFixed(0)} ms over ${ms.length} runs (${ms.map((m) => m.toFixed(0)).join(', ')} ms)`)
})

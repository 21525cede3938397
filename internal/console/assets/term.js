// A small terminal: a VT100/xterm-subset screen (text, CR/LF, backspace,
// tabs, CSI cursor moves and erases, insert/delete, scroll regions, SGR
// colours, the alternate screen) rendered into a <pre>, with keyboard input
// turned into the bytes a terminal sends. It runs over berth's PTY exec API
// (connectShell below). Not xterm.js: the console has no build step and
// ships no vendored third-party code, and a shell, top or vi in a sandbox
// need only this much of a terminal.

const BASE = ['#000000', '#cd3131', '#0dbc79', '#e5e510', '#2472c8', '#bc3fbc', '#11a8cd', '#e5e5e5',
  '#666666', '#f14c4c', '#23d18b', '#f5f543', '#3b8eea', '#d670d6', '#29b8db', '#ffffff'];

export function color256(n) {
  if (n < 16) return BASE[n];
  if (n < 232) {
    const v = [0, 95, 135, 175, 215, 255];
    n -= 16;
    return `rgb(${v[Math.floor(n / 36)]},${v[Math.floor(n / 6) % 6]},${v[n % 6]})`;
  }
  const g = 8 + 10 * (n - 232);
  return `rgb(${g},${g},${g})`;
}

const DEFAULT = Object.freeze({fg: null, bg: null, bold: false, ul: false, inv: false});
const blank = (a = DEFAULT) => ({c: ' ', a});
const MAX_SCROLLBACK = 1000;
const MAX_PARAMS = 32;

// Screen is the terminal's state machine, with no DOM: write() feeds it
// decoded text, lines() reads it back.
export class Screen {
  constructor(cols, rows, {onReply, onScroll} = {}) {
    this.onReply = onReply || (() => {});
    this.onScroll = onScroll || (() => {});
    this.reset(cols, rows);
  }

  reset(cols = this.cols, rows = this.rows) {
    this.cols = cols;
    this.rows = rows;
    this.buf = this.emptyRows(rows);
    this.alt = null; // the main screen while the alternate one shows
    this.x = 0;
    this.y = 0;
    this.attr = DEFAULT;
    this.top = 0;
    this.bottom = rows - 1;
    this.wrap = false; // a printed character in the last column defers its wrap
    this.saved = {x: 0, y: 0, attr: DEFAULT};
    this.cursorVisible = true;
    this.appCursor = false;
    this.state = 'ground';
    this.params = '';
  }

  emptyRows(n) {
    return Array.from({length: n}, () => Array.from({length: this.cols}, () => blank()));
  }

  resize(cols, rows) {
    const fit = (row) => (row.length >= cols ? row.slice(0, cols) : row.concat(Array.from({length: cols - row.length}, () => blank())));
    this.cols = cols;
    while (this.buf.length > rows) {
      const line = this.buf.shift();
      if (!this.alt) this.onScroll(line);
      this.y = Math.max(0, this.y - 1);
    }
    while (this.buf.length < rows) this.buf.push([]);
    this.buf = this.buf.map(fit);
    if (this.alt) this.alt = this.alt.slice(0, rows).map(fit);
    this.rows = rows;
    this.top = 0;
    this.bottom = rows - 1;
    this.x = Math.min(this.x, cols - 1);
    this.y = Math.min(this.y, rows - 1);
    this.wrap = false;
  }

  lines() { return this.buf; }

  write(text) {
    for (const ch of text) this.feed(ch);
  }

  feed(ch) {
    const code = ch.codePointAt(0);
    switch (this.state) {
      case 'ground':
        if (code < 0x20 || code === 0x7f) this.control(code);
        else this.print(ch);
        return;
      case 'esc':
        this.escape(ch);
        return;
      case 'csi':
        if (code >= 0x30 && code <= 0x3f) {
          if (this.params.length < 64) this.params += ch;
        } else if (code >= 0x20 && code <= 0x2f) {
          // intermediates: none of the sequences handled here use them
        } else if (code >= 0x40 && code <= 0x7e) {
          this.state = 'ground';
          this.csi(ch, this.params);
        } else if (code === 0x1b) {
          this.state = 'esc';
        } else if (code < 0x20) {
          this.control(code);
        }
        return;
      case 'osc': // window titles and the like: read and dropped
        if (code === 0x07) this.state = 'ground';
        else if (code === 0x1b) this.state = 'oscEsc';
        return;
      case 'oscEsc':
        this.state = ch === '\\' ? 'ground' : 'osc';
        return;
      case 'charset': // ESC ( B and friends: one more byte
        this.state = 'ground';
        return;
      default:
        this.state = 'ground';
    }
  }

  control(code) {
    switch (code) {
      case 0x08: this.wrap = false; if (this.x > 0) this.x--; break;
      case 0x09: this.x = Math.min(this.cols - 1, (Math.floor(this.x / 8) + 1) * 8); break;
      case 0x0a: case 0x0b: case 0x0c: this.lineFeed(); break;
      case 0x0d: this.wrap = false; this.x = 0; break;
      case 0x1b: this.state = 'esc'; break;
      default: // BEL, SO/SI, NUL, DEL: nothing to draw
    }
  }

  print(ch) {
    if (this.wrap) {
      this.wrap = false;
      this.x = 0;
      this.lineFeed();
    }
    this.buf[this.y][this.x] = {c: ch, a: this.attr};
    if (this.x === this.cols - 1) this.wrap = true;
    else this.x++;
  }

  lineFeed() {
    this.wrap = false;
    if (this.y === this.bottom) this.scrollUp(1);
    else if (this.y < this.rows - 1) this.y++;
  }

  scrollUp(n) {
    for (let i = 0; i < n; i++) {
      const line = this.buf.splice(this.top, 1)[0];
      if (this.top === 0 && !this.alt) this.onScroll(line);
      this.buf.splice(this.bottom, 0, this.blankRow());
    }
  }

  scrollDown(n) {
    for (let i = 0; i < n; i++) {
      this.buf.splice(this.bottom, 1);
      this.buf.splice(this.top, 0, this.blankRow());
    }
  }

  blankRow() { return Array.from({length: this.cols}, () => blank(this.bgOnly())); }

  // Erased cells keep the current background colour, as xterm's do.
  bgOnly() { return this.attr.bg ? {...DEFAULT, bg: this.attr.bg} : DEFAULT; }

  escape(ch) {
    this.state = 'ground';
    switch (ch) {
      case '[': this.state = 'csi'; this.params = ''; break;
      case ']': this.state = 'osc'; break;
      case '(': case ')': case '*': case '+': this.state = 'charset'; break;
      case '7': this.saved = {x: this.x, y: this.y, attr: this.attr}; break;
      case '8': ({x: this.x, y: this.y, attr: this.attr} = this.saved); this.wrap = false; break;
      case 'D': this.lineFeed(); break;
      case 'E': this.x = 0; this.lineFeed(); break;
      case 'M': if (this.y === this.top) this.scrollDown(1); else if (this.y > 0) this.y--; break;
      case 'c': this.reset(); break;
      default: // '=', '>' keypad modes and the rest: ignored
    }
  }

  csi(final, raw) {
    const priv = raw.startsWith('?');
    const ps = (priv ? raw.slice(1) : raw).split(';').slice(0, MAX_PARAMS).map((p) => (p === '' ? NaN : parseInt(p, 10)));
    const n = (i, d = 1) => (Number.isFinite(ps[i]) && ps[i] > 0 ? Math.min(ps[i], 10000) : d);
    const clampY = (y) => Math.max(0, Math.min(this.rows - 1, y));
    const clampX = (x) => Math.max(0, Math.min(this.cols - 1, x));
    this.wrap = false;
    if (priv) {
      if (final === 'h' || final === 'l') this.privateMode(ps, final === 'h');
      return;
    }
    switch (final) {
      case 'A': this.y = Math.max(this.y >= this.top ? this.top : 0, this.y - n(0)); break;
      case 'B': this.y = Math.min(this.y <= this.bottom ? this.bottom : this.rows - 1, this.y + n(0)); break;
      case 'C': this.x = clampX(this.x + n(0)); break;
      case 'D': this.x = clampX(this.x - n(0)); break;
      case 'E': this.x = 0; this.y = clampY(this.y + n(0)); break;
      case 'F': this.x = 0; this.y = clampY(this.y - n(0)); break;
      case 'G': case '`': this.x = clampX(n(0) - 1); break;
      case 'd': this.y = clampY(n(0) - 1); break;
      case 'H': case 'f': this.y = clampY(n(0) - 1); this.x = clampX(n(1) - 1); break;
      case 'J': this.eraseDisplay(Number.isFinite(ps[0]) ? ps[0] : 0); break;
      case 'K': this.eraseLine(Number.isFinite(ps[0]) ? ps[0] : 0); break;
      case 'X': for (let i = 0; i < n(0) && this.x + i < this.cols; i++) this.buf[this.y][this.x + i] = blank(this.bgOnly()); break;
      case 'P': { const row = this.buf[this.y]; row.splice(this.x, Math.min(n(0), this.cols - this.x)); while (row.length < this.cols) row.push(blank(this.bgOnly())); break; }
      case '@': { const row = this.buf[this.y]; for (let i = 0; i < Math.min(n(0), this.cols - this.x); i++) row.splice(this.x, 0, blank(this.bgOnly())); row.length = this.cols; break; }
      case 'L': if (this.y >= this.top && this.y <= this.bottom) { const t = this.top; this.top = this.y; this.scrollDown(Math.min(n(0), this.bottom - this.y + 1)); this.top = t; } break;
      case 'M': if (this.y >= this.top && this.y <= this.bottom) { const t = this.top; this.top = this.y; const a = this.alt; this.alt = this.alt || true; this.scrollUp(Math.min(n(0), this.bottom - this.y + 1)); this.alt = a; this.top = t; } break;
      case 'S': this.scrollUp(Math.min(n(0), this.rows)); break;
      case 'T': this.scrollDown(Math.min(n(0), this.rows)); break;
      case 'm': this.sgr(ps); break;
      case 'r': {
        const t = n(0) - 1;
        const b = Number.isFinite(ps[1]) && ps[1] > 0 ? Math.min(ps[1], this.rows) - 1 : this.rows - 1;
        if (t < b) { this.top = t; this.bottom = b; this.x = 0; this.y = 0; }
        break;
      }
      case 's': this.saved = {x: this.x, y: this.y, attr: this.attr}; break;
      case 'u': ({x: this.x, y: this.y, attr: this.attr} = this.saved); break;
      case 'n': if (ps[0] === 6) this.onReply(`\x1b[${this.y + 1};${this.x + 1}R`); else if (ps[0] === 5) this.onReply('\x1b[0n'); break;
      case 'c': this.onReply('\x1b[?1;2c'); break; // "a VT100 with advanced video"
      default: // modes, tab stops, ...: ignored
    }
  }

  privateMode(ps, on) {
    for (const p of ps) {
      if (p === 25) this.cursorVisible = on;
      else if (p === 1) this.appCursor = on;
      else if (p === 47 || p === 1047 || p === 1049) {
        if (on && !this.alt) {
          if (p === 1049) this.saved = {x: this.x, y: this.y, attr: this.attr};
          this.alt = this.buf;
          this.buf = this.emptyRows(this.rows);
        } else if (!on && this.alt) {
          this.buf = this.alt;
          this.alt = null;
          if (p === 1049) ({x: this.x, y: this.y, attr: this.attr} = this.saved);
        }
      }
    }
  }

  eraseDisplay(mode) {
    if (mode === 0) {
      this.eraseLine(0);
      for (let y = this.y + 1; y < this.rows; y++) this.buf[y] = this.blankRow();
    } else if (mode === 1) {
      this.eraseLine(1);
      for (let y = 0; y < this.y; y++) this.buf[y] = this.blankRow();
    } else if (mode === 2 || mode === 3) {
      for (let y = 0; y < this.rows; y++) this.buf[y] = this.blankRow();
    }
  }

  eraseLine(mode) {
    const row = this.buf[this.y];
    const [from, to] = mode === 0 ? [this.x, this.cols] : mode === 1 ? [0, this.x + 1] : [0, this.cols];
    for (let x = from; x < to; x++) row[x] = blank(this.bgOnly());
  }

  sgr(ps) {
    if (ps.length === 0) ps = [0];
    let a = {...this.attr};
    for (let i = 0; i < ps.length; i++) {
      const p = Number.isFinite(ps[i]) ? ps[i] : 0;
      if (p === 0) a = {...DEFAULT};
      else if (p === 1) a.bold = true;
      else if (p === 4) a.ul = true;
      else if (p === 7) a.inv = true;
      else if (p === 22) a.bold = false;
      else if (p === 24) a.ul = false;
      else if (p === 27) a.inv = false;
      else if (p >= 30 && p <= 37) a.fg = BASE[p - 30];
      else if (p === 39) a.fg = null;
      else if (p >= 40 && p <= 47) a.bg = BASE[p - 40];
      else if (p === 49) a.bg = null;
      else if (p >= 90 && p <= 97) a.fg = BASE[p - 90 + 8];
      else if (p >= 100 && p <= 107) a.bg = BASE[p - 100 + 8];
      else if (p === 38 || p === 48) {
        let c = null;
        if (ps[i + 1] === 5 && Number.isFinite(ps[i + 2])) { c = color256(Math.max(0, Math.min(255, ps[i + 2]))); i += 2; }
        else if (ps[i + 1] === 2) { const [r, g, b] = [ps[i + 2], ps[i + 3], ps[i + 4]].map((v) => Math.max(0, Math.min(255, v | 0))); c = `rgb(${r},${g},${b})`; i += 4; }
        if (p === 38) a.fg = c; else a.bg = c;
      }
    }
    this.attr = Object.freeze(a);
  }
}

// keyBytes is what a terminal sends for a key press ('' for keys it leaves
// to the browser: Shift+Tab moves focus out, Ctrl+Shift+C/V copy and paste).
export function keyBytes(ev, appCursor = false) {
  if (ev.isComposing || ev.metaKey) return '';
  if (ev.key === 'Tab' && ev.shiftKey) return '';
  if (ev.ctrlKey && ev.shiftKey) return '';
  const csi = appCursor ? '\x1bO' : '\x1b[';
  const named = {
    Enter: '\r', Backspace: '\x7f', Tab: '\t', Escape: '\x1b',
    ArrowUp: `${csi}A`, ArrowDown: `${csi}B`, ArrowRight: `${csi}C`, ArrowLeft: `${csi}D`,
    Home: '\x1b[H', End: '\x1b[F', Delete: '\x1b[3~', Insert: '\x1b[2~', PageUp: '\x1b[5~', PageDown: '\x1b[6~',
    F1: '\x1bOP', F2: '\x1bOQ', F3: '\x1bOR', F4: '\x1bOS',
  };
  if (named[ev.key]) return (ev.altKey ? '\x1b' : '') + named[ev.key];
  if (ev.key.length !== 1) return '';
  if (ev.ctrlKey) {
    const c = ev.key.toLowerCase().charCodeAt(0);
    if (c >= 97 && c <= 122) return String.fromCharCode(c - 96);
    const map = {' ': '\x00', '@': '\x00', '[': '\x1b', '\\': '\x1c', ']': '\x1d', '^': '\x1e', '_': '\x1f'};
    return map[ev.key] || '';
  }
  return (ev.altKey ? '\x1b' : '') + ev.key;
}

// Terminal renders a Screen into el and reads the keyboard.
export class Terminal {
  constructor(el, {onInput, onResize, label = 'Terminal'} = {}) {
    this.onInput = onInput || (() => {});
    this.onResize = onResize || (() => {});
    this.decoder = new TextDecoder('utf-8');
    this.pre = document.createElement('pre');
    this.pre.className = 'term';
    this.pre.tabIndex = 0;
    this.pre.setAttribute('aria-label', `${label}: type to send input; Shift+Tab leaves`);
    this.pre.setAttribute('aria-roledescription', 'terminal');
    this.history = document.createElement('div'); // lines scrolled off, drawn once
    this.live = document.createElement('div');
    this.pre.append(this.history, this.live);
    el.appendChild(this.pre);
    const [cols, rows] = this.fit();
    this.screen = new Screen(cols, rows, {
      onReply: (s) => this.onInput(s),
      onScroll: (line) => this.scrolled(line),
    });
    this.pre.addEventListener('keydown', (ev) => {
      const s = keyBytes(ev, this.screen.appCursor);
      if (s) { ev.preventDefault(); this.onInput(s); }
    });
    this.pre.addEventListener('paste', (ev) => {
      ev.preventDefault();
      const text = (ev.clipboardData && ev.clipboardData.getData('text/plain')) || '';
      if (text) this.onInput(text.replace(/\r?\n/g, '\r'));
    });
    this.observer = new ResizeObserver(() => {
      clearTimeout(this.resizeTimer);
      this.resizeTimer = setTimeout(() => {
        const [c, r] = this.fit();
        if (c !== this.screen.cols || r !== this.screen.rows) {
          this.screen.resize(c, r);
          this.draw();
          this.onResize(c, r);
        }
      }, 150);
    });
    this.observer.observe(this.pre);
    this.draw();
  }

  get cols() { return this.screen.cols; }
  get rows() { return this.screen.rows; }

  // fit is the size in cells that the element's width holds (24 rows).
  fit() {
    const probe = document.createElement('span');
    probe.textContent = 'MMMMMMMMMM';
    this.live.appendChild(probe);
    const cw = probe.getBoundingClientRect().width / 10 || 8;
    probe.remove();
    const style = getComputedStyle(this.pre);
    const inner = this.pre.clientWidth - parseFloat(style.paddingLeft || 0) - parseFloat(style.paddingRight || 0);
    return [Math.max(20, Math.min(250, Math.floor(inner / cw) - 1)), 24];
  }

  write(bytes) {
    this.screen.write(typeof bytes === 'string' ? bytes : this.decoder.decode(bytes, {stream: true}));
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
  }

  focus() { this.pre.focus(); }

  dispose() { this.observer.disconnect(); clearTimeout(this.resizeTimer); }

  scrolled(line) {
    this.history.appendChild(this.renderLine(line, -1));
    while (this.history.childNodes.length > MAX_SCROLLBACK) this.history.firstChild.remove();
  }

  renderLine(row, cursorX) {
    const div = document.createElement('div');
    let run = '';
    let runAttr = null;
    const flush = () => {
      if (!run) return;
      if (runAttr === DEFAULT) div.appendChild(document.createTextNode(run));
      else {
        const span = document.createElement('span');
        span.textContent = run;
        let {fg, bg} = runAttr;
        if (runAttr.inv) [fg, bg] = [bg || '#111111', fg || '#dddddd'];
        if (fg) span.style.color = fg;
        if (bg) span.style.backgroundColor = bg;
        if (runAttr.bold) span.style.fontWeight = '700';
        if (runAttr.ul) span.style.textDecoration = 'underline';
        div.appendChild(span);
      }
      run = '';
    };
    // Trailing blanks are not drawn, so copied text has no padding.
    let end = row.length;
    while (end > 0 && row[end - 1].c === ' ' && row[end - 1].a === DEFAULT && end - 1 !== cursorX) end--;
    for (let x = 0; x < end; x++) {
      const cell = row[x];
      if (x === cursorX) {
        flush();
        const cur = document.createElement('span');
        cur.className = 'cur';
        cur.textContent = cell.c;
        div.appendChild(cur);
        runAttr = null;
        continue;
      }
      if (cell.a !== runAttr) { flush(); runAttr = cell.a; }
      run += cell.c;
    }
    flush();
    if (!div.childNodes.length) div.appendChild(document.createTextNode(' '));
    return div;
  }

  draw() {
    const s = this.screen;
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    this.live.replaceChildren(...s.lines().map((row, y) => this.renderLine(row, s.cursorVisible && y === s.y ? s.x : -1)));
    if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
  }
}

function b64bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// connectShell starts a shell with a PTY in sandbox id and joins it to a
// Terminal in el: output from the exec stream (NDJSON events), input as
// POST .../stdin in order (keys typed while one is in flight are sent
// together next), size changes as POST .../resize. It resolves when the
// stream ends; close() hangs the shell up.
export function connectShell(api, id, el, {onStatus = () => {}, signal} = {}) {
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  let pid = 0;
  let queued = '';
  let sending = false;
  let closed = false;
  const enc = new TextEncoder();
  const flush = async () => {
    if (sending || !pid || !queued) return;
    sending = true;
    const data = queued;
    queued = '';
    try {
      await api('POST', `${base}/processes/${pid}/stdin`, enc.encode(data));
    } catch (e) {
      if (!closed) onStatus(`input failed: ${e.message}`, true);
    }
    sending = false;
    flush();
  };
  const term = new Terminal(el, {
    onInput: (s) => { queued += s; flush(); },
    onResize: (cols, rows) => { if (pid) api('POST', `${base}/processes/${pid}/resize`, {cols, rows}).catch(() => {}); },
  });
  const ctl = new AbortController();
  if (signal) signal.addEventListener('abort', () => close());
  const close = () => {
    if (closed) return;
    closed = true;
    if (pid) api('POST', `${base}/processes/${pid}/signal`, {signal: 1}).catch(() => {}); // SIGHUP, as a closed terminal
    ctl.abort();
    term.dispose();
  };
  const done = (async () => {
    onStatus('connecting…');
    const resp = await api('POST', `${base}/exec`, {
      cmd: ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi'],
      env: {TERM: 'xterm-256color'}, tty: {cols: term.cols, rows: term.rows}, stdin: true,
    }, {raw: true, signal: ctl.signal});
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    let exit = null;
    try {
      for (;;) {
        const {value, done: end} = await reader.read();
        if (end) break;
        buf += dec.decode(value, {stream: true});
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.trim()) continue;
          const ev = JSON.parse(line);
          if (ev.type === 'start') { pid = ev.pid; onStatus(`connected (pid ${pid})`); term.focus(); flush(); }
          else if ((ev.type === 'pty' || ev.type === 'stdout' || ev.type === 'stderr') && ev.data) term.write(b64bytes(ev.data));
          else if (ev.type === 'exit') exit = ev;
          else if (ev.type === 'error') onStatus(`stream ended: ${ev.error}`, true);
        }
      }
    } catch (e) {
      if (!closed) throw e;
    }
    if (exit) {
      const how = exit.signal ? `signal ${exit.signal}` : `exit code ${exit.exit_code}`;
      term.write(`\r\n[process ended: ${how}]\r\n`);
      onStatus(`ended (${how})`);
    }
    closed = true;
  })();
  return {term, close, done};
}

// berth console: the router, the API helper (session cookie + CSRF header),
// the session, and the list of views. A view is a module exporting
// {id, title, nav, render(el, ctx)}: id is its route (#/<id>/<args...>),
// nav puts it in the top bar, render fills el and may return a cleanup
// function; ctx gives it the API, the route's args, the session and helpers
// (see makeCtx). To add a view: write views/<name>.js and list it here.
import {h, fill} from './dom.js';
import fleet from './views/fleet.js';
import sandbox from './views/sandbox.js';
import orphans from './views/orphans.js';
import cost from './views/cost.js';
import pools from './views/pools.js';

export const views = [fleet, sandbox, orphans, cost, pools];

const CSRF_HEADER = 'X-Berth-CSRF';
let session = null; // {owner, admin, csrf, expires_at}

// APIError carries the server's {code, message, field, reason}.
export class APIError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.field = body && body.field;
    this.reason = body && body.reason;
  }
}

async function errorOf(resp) {
  let body = null;
  try { body = await resp.json(); } catch { /* not JSON */ }
  return new APIError(resp.status, body);
}

// api calls berth's REST API as the signed-in session. body: a plain object
// (sent as JSON), or a Blob/File/string/Uint8Array (sent as is). opts.raw
// returns the Response (streams, downloads); opts.signal aborts.
export async function api(method, path, body, opts = {}) {
  const headers = {};
  if (method !== 'GET' && method !== 'HEAD' && session) headers[CSRF_HEADER] = session.csrf;
  let payload = body;
  if (body !== undefined && body !== null && !(body instanceof Blob) && !(body instanceof Uint8Array) && typeof body !== 'string') {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  const resp = await fetch(path, {method, headers, body: payload, credentials: 'same-origin', signal: opts.signal, cache: 'no-store'});
  if (resp.status === 401 && session) {
    session = null;
    route();
  }
  if (!resp.ok) throw await errorOf(resp);
  if (opts.raw) return resp;
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

// toast says something short to everyone, screen readers included.
export function toast(msg, isError = false) {
  const t = document.getElementById('toast');
  t.textContent = msg;
  t.classList.toggle('error', isError);
  t.classList.add('show');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove('show'), 5000);
}

// confirmAction asks before a destructive action; resolves true on OK.
export function confirmAction(text, okLabel = 'OK') {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel;
  const back = document.activeElement;
  return new Promise((resolve) => {
    // The close event is a queued task: an earlier opening's can arrive
    // after this one began (a click right after a cancel). It is not this
    // opening's answer while the dialog is still open.
    const onClose = () => {
      if (dlg.open) return;
      dlg.removeEventListener('close', onClose);
      resolve(dlg.returnValue === 'ok');
      if (back && back.focus) back.focus();
    };
    dlg.addEventListener('close', onClose);
    dlg.returnValue = 'cancel';
    dlg.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

export function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

let cleanup = null;
let controller = null;

function makeCtx(args) {
  controller = new AbortController();
  const signal = controller.signal;
  return {
    api, args, session, signal, navigate, toast, confirm: confirmAction,
    // every runs fn now and then every ms until the view is left; a failing
    // run is reported once and retried.
    every(ms, fn) {
      let timer = null;
      let failed = false;
      const tick = async () => {
        try { await fn(); failed = false; } catch (e) {
          if (signal.aborted) return;
          if (!failed) toast(e.message, true);
          failed = true;
        }
        if (!signal.aborted) timer = setTimeout(tick, ms);
      };
      signal.addEventListener('abort', () => clearTimeout(timer));
      tick();
    },
  };
}

function renderNav(active) {
  const nav = document.getElementById('nav');
  if (!session) { fill(nav); return; }
  fill(nav, h('ul', {}, views.filter((v) => v.nav).map((v) =>
    h('li', {}, h('a', {href: `#/${v.id}`, 'aria-current': v.id === active ? 'page' : null}, v.title)))));
  document.getElementById('who').textContent = `${session.owner}${session.admin ? ' (admin)' : ''}`;
  document.getElementById('signout').hidden = false;
}

function signInView(main) {
  document.getElementById('who').textContent = '';
  document.getElementById('signout').hidden = true;
  document.title = 'Sign in · berth console';
  const err = h('p', {id: 'signin-error', class: 'error', role: 'alert'});
  const input = h('input', {id: 'api-key', name: 'api_key', type: 'password', autocomplete: 'off', required: true,
    spellcheck: 'false', 'aria-describedby': 'signin-help signin-error'});
  const form = h('form', {class: 'card signin', id: 'signin', onsubmit: async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    try {
      session = await api('POST', '/ui/session', {api_key: input.value});
      input.value = '';
      route();
    } catch (e) {
      err.textContent = `Sign-in failed: ${e.message}`;
      input.focus();
    }
  }},
  h('h1', {}, 'Sign in'),
  h('label', {for: 'api-key'}, 'API key'),
  input,
  h('p', {id: 'signin-help', class: 'help'}, 'The key is exchanged for a session cookie and not kept in the page.'),
  h('button', {type: 'submit'}, 'Sign in'),
  err);
  fill(main, form);
  input.focus();
}

async function route() {
  if (cleanup) { try { cleanup(); } catch { /* view already gone */ } cleanup = null; }
  if (controller) controller.abort();
  const main = document.getElementById('main');
  if (!session) { renderNav(null); signInView(main); return; }
  const parts = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  const view = views.find((v) => v.id === parts[0]) || views[0];
  renderNav(view.id);
  document.title = `${view.title} · berth console`;
  main.replaceChildren();
  main.dataset.view = view.id;
  try {
    const c = await view.render(main, makeCtx(parts.slice(1)));
    if (typeof c === 'function') cleanup = c;
  } catch (e) {
    if (!(e instanceof DOMException && e.name === 'AbortError')) fill(main, h('p', {class: 'error', role: 'alert'}, e.message));
  }
  if (document.activeElement === document.body) main.focus({preventScroll: true});
}

async function start() {
  document.getElementById('skip').addEventListener('click', (ev) => {
    ev.preventDefault();
    document.getElementById('main').focus();
  });
  document.getElementById('signout').addEventListener('click', async () => {
    try { await api('DELETE', '/ui/session'); } catch { /* signed out either way */ }
    session = null;
    route();
  });
  try {
    session = await api('GET', '/ui/session');
  } catch {
    session = null;
  }
  window.addEventListener('hashchange', route);
  route();
}

start();

// DOM helpers shared by the views. Everything a sandbox can write (file
// names, argv, labels, output) reaches the page through text nodes, never
// innerHTML.

// h builds an element: h('a', {href: '#/x', class: 'k'}, 'text', child, ...).
// Attributes starting with "on" are listeners; null/false attributes are skipped.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// clear empties an element and fills it with children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// when formats an RFC 3339 time for people ("" for zero times).
export function when(t) {
  if (!t || t.startsWith('0001-')) return '';
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleString();
}

// ago is "3m ago" / "in 2h".
export function ago(t, now = Date.now()) {
  if (!t || t.startsWith('0001-')) return '';
  const s = Math.round((now - new Date(t).getTime()) / 1000);
  const a = Math.abs(s);
  const v = a < 60 ? `${a}s` : a < 3600 ? `${Math.floor(a / 60)}m` : a < 86400 ? `${Math.floor(a / 3600)}h` : `${Math.floor(a / 86400)}d`;
  return s >= 0 ? `${v} ago` : `in ${v}`;
}

export function mib(n) {
  if (!n) return '0 MiB';
  return n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${Math.round(n)} MiB`;
}

export function bytes(n) {
  if (n === undefined || n === null) return '';
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1 << 30) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / (1 << 30)).toFixed(1)} GiB`;
}

// badge is a state label; the colour is decoration, the text carries it.
export function badge(state) {
  return h('span', {class: `badge st-${state}`}, state);
}

// section is a titled region, reachable by its heading.
export function section(title, id, ...children) {
  return h('section', {'aria-labelledby': id, class: 'card'}, h('h2', {id}, title), ...children);
}

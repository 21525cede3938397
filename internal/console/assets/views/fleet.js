// Fleet: every sandbox the session may see (an owner its own, the admin
// all), by state/owner/template/runtime with filters, counts and memory per
// state, refreshed every 2 s (a poll: one cheap list call, and it survives
// a daemon restart without reconnect logic).
import {h, fill, badge, ago, mib, section} from '../dom.js';

const STATES = ['creating', 'running', 'paused', 'stopped', 'failed'];
const filters = {state: '', owner: '', template: '', runtime: '', q: ''}; // kept while the page lives

async function listAll(api, signal) {
  const out = [];
  let cursor = '';
  for (let i = 0; i < 20; i++) { // at most 20 pages of 500
    const r = await api('GET', `/v1/sandboxes?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`, undefined, {signal});
    out.push(...(r.sandboxes || []));
    if (!r.next) break;
    cursor = r.next;
  }
  return out;
}

function select(id, label, values, key, onchange) {
  const sel = h('select', {id, onchange: (ev) => { filters[key] = ev.target.value; onchange(); }},
    h('option', {value: ''}, 'all'),
    values.map((v) => h('option', {value: v, selected: filters[key] === v}, v)));
  return h('div', {class: 'field'}, h('label', {for: id}, label), sel);
}

function matches(sb) {
  if (filters.state && sb.state !== filters.state) return false;
  if (filters.owner && sb.owner !== filters.owner) return false;
  if (filters.template && sb.template !== filters.template) return false;
  if (filters.runtime && sb.runtime !== filters.runtime) return false;
  if (filters.q) {
    const q = filters.q.toLowerCase();
    const labels = Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');
    if (!`${sb.id} ${labels}`.toLowerCase().includes(q)) return false;
  }
  return true;
}

const uniq = (xs) => [...new Set(xs.filter(Boolean))].sort();

export default {
  id: 'fleet',
  title: 'Fleet',
  nav: true,
  render(el, ctx) {
    let list = [];
    let usedByState = {}; // state → sum of memory_avg_mib from /v1/usage
    const summary = h('div', {id: 'fleet-summary'});
    const controls = h('div', {class: 'filters', role: 'group', 'aria-label': 'Filters'});
    const table = h('div', {id: 'fleet-table', class: 'scroll'});
    const status = h('p', {class: 'help', id: 'fleet-status', 'aria-live': 'polite'});
    fill(el, h('h1', {}, 'Fleet'),
      section('By state', 'h-summary', summary),
      section('Sandboxes', 'h-sandboxes', controls, status, table));

    const drawControls = () => {
      const search = h('input', {id: 'f-q', type: 'search', value: filters.q, placeholder: 'id or label',
        oninput: (ev) => { filters.q = ev.target.value; drawTable(); }});
      fill(controls,
        select('f-state', 'State', uniq([...STATES, ...list.map((s) => s.state)]), 'state', drawTable),
        ctx.session.admin ? select('f-owner', 'Owner', uniq(list.map((s) => s.owner)), 'owner', drawTable) : null,
        select('f-template', 'Template', uniq(list.map((s) => s.template)), 'template', drawTable),
        select('f-runtime', 'Runtime', uniq(list.map((s) => s.runtime)), 'runtime', drawTable),
        h('div', {class: 'field'}, h('label', {for: 'f-q'}, 'Search'), search));
    };

    const drawSummary = () => {
      const by = {};
      for (const sb of list) {
        const b = by[sb.state] || (by[sb.state] = {n: 0, mem: 0});
        b.n++;
        b.mem += (sb.resources && sb.resources.memory_mib) || 0;
      }
      const states = uniq([...STATES.filter((s) => by[s]), ...Object.keys(by)]);
      fill(summary, h('div', {class: 'scroll'}, h('table', {class: 'grid', id: 'state-counts'},
        h('caption', {}, `${list.length} sandboxes`),
        h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, 'State'), h('th', {scope: 'col'}, 'Count'),
          h('th', {scope: 'col'}, 'Memory reserved'), h('th', {scope: 'col'}, 'Memory used (avg)'))),
        h('tbody', {}, states.map((st) => h('tr', {'data-state': st},
          h('th', {scope: 'row'}, badge(st)), h('td', {class: 'count'}, by[st].n),
          h('td', {}, mib(by[st].mem)), h('td', {}, usedByState[st] === undefined ? '–' : mib(usedByState[st]))))))));
    };

    const drawTable = () => {
      const rows = list.filter(matches).sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
      status.textContent = `${rows.length} of ${list.length} shown`;
      if (!rows.length) { fill(table, h('p', {}, list.length ? 'No sandbox matches the filters.' : 'No sandboxes.')); return; }
      fill(table, h('table', {class: 'grid', id: 'sandboxes'},
        h('thead', {}, h('tr', {}, ['Sandbox', 'State', 'Owner', 'Template', 'Runtime', 'Memory', 'Created', 'Expires']
          .map((c, i) => h('th', {scope: 'col', class: i >= 5 ? 'hide-narrow' : null}, c)))),
        h('tbody', {}, rows.map((sb) => h('tr', {'data-id': sb.id, 'data-state': sb.state},
          h('th', {scope: 'row'}, h('a', {href: `#/sandbox/${encodeURIComponent(sb.id)}`}, sb.id)),
          h('td', {}, badge(sb.state)),
          h('td', {}, sb.owner), h('td', {}, sb.template), h('td', {}, sb.runtime),
          h('td', {class: 'hide-narrow'}, mib(sb.resources && sb.resources.memory_mib)),
          h('td', {class: 'hide-narrow', title: sb.created_at}, ago(sb.created_at)),
          h('td', {class: 'hide-narrow', title: sb.expires_at}, ago(sb.expires_at)))))));
    };

    let lastKeys = '';
    ctx.every(2000, async () => {
      list = await listAll(ctx.api, ctx.signal);
      const keys = JSON.stringify([uniq(list.map((s) => s.owner)), uniq(list.map((s) => s.template)), uniq(list.map((s) => s.runtime)), uniq(list.map((s) => s.state))]);
      if (keys !== lastKeys && !controls.contains(document.activeElement)) { drawControls(); lastKeys = keys; }
      drawSummary();
      drawTable();
    });
    ctx.every(15000, async () => {
      const u = await ctx.api('GET', '/v1/usage', undefined, {signal: ctx.signal});
      usedByState = {};
      for (const line of u.sandboxes || []) {
        if (line.state) usedByState[line.state] = (usedByState[line.state] || 0) + (line.memory_avg_mib || 0);
      }
      drawSummary();
    });
  },
};

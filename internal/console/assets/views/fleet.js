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
    let usedByID = {}; // sandbox id → memory_avg_mib from /v1/usage
    const summary = h('div', {id: 'fleet-summary'});
    const controls = h('div', {class: 'filters', role: 'group', 'aria-label': 'Filters'});
    const table = h('div', {id: 'fleet-table', class: 'scroll'});
    const status = h('p', {class: 'help', id: 'fleet-status', 'aria-live': 'polite'});
    fill(el, h('h1', {}, 'Fleet'),
      section('Summary', 'h-summary', summary),
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

    // The summary groups by one dimension (state by default): count, memory
    // reserved (the sum of memory limits) and used (the sum of averages).
    let groupBy = 'state';
    const groupSel = h('select', {id: 'f-group', onchange: (ev) => { groupBy = ev.target.value; drawSummary(); }},
      ['state', 'owner', 'template', 'runtime'].map((g) => h('option', {value: g}, g)));
    const groupTable = h('div', {class: 'scroll'});
    summary.append(h('div', {class: 'field'}, h('label', {for: 'f-group'}, 'Group by'), groupSel), groupTable);
    const drawSummary = () => {
      const by = {};
      for (const sb of list) {
        const k = sb[groupBy] || '–';
        const b = by[k] || (by[k] = {n: 0, mem: 0, used: 0, hasUsed: false});
        b.n++;
        b.mem += (sb.resources && sb.resources.memory_mib) || 0;
        if (usedByID[sb.id] !== undefined) { b.used += usedByID[sb.id]; b.hasUsed = true; }
      }
      const keys = groupBy === 'state' ? uniq([...STATES.filter((s) => by[s]), ...Object.keys(by)]) : Object.keys(by).sort();
      fill(groupTable, h('table', {class: 'grid', id: 'state-counts'},
        h('caption', {}, `${list.length} sandboxes by ${groupBy}`),
        h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, groupBy[0].toUpperCase() + groupBy.slice(1)), h('th', {scope: 'col'}, 'Count'),
          h('th', {scope: 'col'}, 'Memory reserved'), h('th', {scope: 'col'}, 'Memory used (avg)'))),
        h('tbody', {}, keys.map((k) => h('tr', {'data-group': k, 'data-state': groupBy === 'state' ? k : null},
          h('th', {scope: 'row'}, groupBy === 'state' ? badge(k) : k), h('td', {class: 'count'}, by[k].n),
          h('td', {}, mib(by[k].mem)), h('td', {}, by[k].hasUsed ? mib(by[k].used) : '–'))))));
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
      usedByID = {};
      for (const line of u.sandboxes || []) {
        if (line.sandbox_id) usedByID[line.sandbox_id] = line.memory_avg_mib || 0;
      }
      drawSummary();
    });
  },
};

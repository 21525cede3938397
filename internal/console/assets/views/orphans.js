// Orphans: what nobody touched for N days (GET /v1/reports/orphans), what
// each costs per day on both bases, and a clean-up with confirmation
// (POST /v1/reports/orphans/cleanup, which deletes only what is still an
// orphan when it arrives). Route: #/orphans[/<days>].
import {h, fill, badge, ago, section} from '../dom.js';

export function money(v, currency) {
  const n = Number(v) || 0;
  // Two significant digits below one cent, so small costs do not read as 0.
  const digits = n !== 0 && Math.abs(n) < 0.01 ? Math.min(8, Math.ceil(-Math.log10(Math.abs(n))) + 1) : 2;
  return `${n.toFixed(digits)}${currency ? ` ${currency}` : ''}`;
}

// currencyOf asks the cheapest priced endpoint for the server's currency.
export async function currencyOf(ctx) {
  try {
    const s = await ctx.api('GET', '/v1/usage/series?from=1h', undefined, {signal: ctx.signal});
    return (s.prices && s.prices.currency) || '';
  } catch { return ''; }
}

const cleanable = (it) => it.kind === 'sandbox' || it.kind === 'snapshot';

// wrap lets a header cell break its words (the grid's headers do not), set
// through the CSSOM: the console's CSP refuses style attributes.
function wrap(el) {
  el.style.whiteSpace = 'normal';
  return el;
}

export default {
  id: 'orphans',
  title: 'Orphans',
  nav: true,
  async render(el, ctx) {
    let days = 7;
    if (ctx.args[0] !== undefined && /^\d+$/.test(ctx.args[0])) days = Number(ctx.args[0]);
    let items = [];
    const selected = new Set(); // "kind/id"
    const currency = await currencyOf(ctx);

    const daysInput = h('input', {id: 'o-days', type: 'number', min: 0, max: 3650, value: days, inputmode: 'numeric',
      'aria-describedby': 'o-days-help'});
    const form = h('form', {class: 'filters', id: 'orphans-form', onsubmit: (ev) => {
      ev.preventDefault();
      ctx.navigate(`#/orphans/${Math.max(0, Number(daysInput.value) || 0)}`);
    }},
    h('div', {class: 'field'}, h('label', {for: 'o-days'}, 'Untouched for at least (days)'), daysInput,
      h('span', {id: 'o-days-help', class: 'help'}, 'No API call, client, file write, egress or CPU for this long.')),
    h('div', {class: 'field'}, h('span', {'aria-hidden': 'true'}, '\u00a0'), h('button', {type: 'submit'}, 'Show')));
    const summary = h('p', {id: 'orphans-summary', 'aria-live': 'polite'});
    const bulk = h('button', {type: 'button', class: 'danger hide-narrow', id: 'orphans-cleanup-selected', disabled: true,
      onclick: () => cleanup(items.filter((it) => selected.has(`${it.kind}/${it.id}`)))}, 'Clean up selected');
    const table = h('div', {class: 'scroll', id: 'orphans-table'});
    fill(el, h('h1', {}, 'Orphans'),
      section('Report', 'h-orphans-report', form, summary, h('div', {class: 'row'}, bulk), table));

    const updateBulk = () => {
      bulk.disabled = selected.size === 0;
      bulk.textContent = selected.size ? `Clean up selected (${selected.size})` : 'Clean up selected';
    };

    const cleanup = async (list) => {
      list = list.filter(cleanable);
      if (!list.length) return;
      const names = list.map((it) => `${it.kind} ${it.id}`).join(', ');
      const perDay = list.reduce((s, it) => s + (it.cost_per_day_reserved || 0), 0);
      const ok = await ctx.confirm(`Delete ${names}? This frees ${money(perDay, currency)} per day (reserved basis) and cannot be undone.`,
        list.length === 1 ? `Delete ${list[0].kind}` : `Delete ${list.length}`);
      if (!ok) return;
      const body = {days, sandboxes: list.filter((it) => it.kind === 'sandbox').map((it) => it.id),
        snapshots: list.filter((it) => it.kind === 'snapshot').map((it) => it.id)};
      try {
        const r = await ctx.api('POST', '/v1/reports/orphans/cleanup', body);
        for (const d of r.deleted) selected.delete(`${d.kind}/${d.id}`);
        const refused = r.refused.map((x) => `${x.kind} ${x.id}: ${x.error.message}`);
        ctx.toast(`Deleted ${r.deleted.length}.${refused.length ? ` Refused ${refused.length}: ${refused.join('; ')}` : ''}`, refused.length > 0);
      } catch (e) {
        ctx.toast(`Clean-up failed: ${e.message}`, true);
      }
      await load();
    };

    const draw = () => {
      const total = {reserved: 0, active: 0, n: 0};
      for (const it of items) { total.reserved += it.cost_per_day_reserved || 0; total.active += it.cost_per_day_active || 0; total.n++; }
      summary.textContent = items.length
        ? `${items.length} ${items.length === 1 ? 'orphan' : 'orphans'} untouched for ${days}+ days cost ${money(total.reserved, currency)} per day reserved, ${money(total.active, currency)} per day active.`
        : `Nothing untouched for ${days}+ days.`;
      for (const k of [...selected]) if (!items.some((it) => `${it.kind}/${it.id}` === k)) selected.delete(k);
      updateBulk();
      if (!items.length) { fill(table); return; }
      const cols = ['Select', 'Kind', 'ID', ctx.session.admin ? 'Owner' : null, 'State', 'Template', 'Idle', 'Age',
        'Per day (reserved)', 'Per day (active)', 'So far (reserved / active)', 'Action'].filter(Boolean);
      // At a phone's width: the id, idle time, cost per day (reserved) and the button.
      const narrow = new Set(['Select', 'Kind', 'State', 'Template', 'Age', 'Per day (active)', 'So far (reserved / active)']);
      fill(table, h('table', {class: 'grid', id: 'orphans'},
        h('caption', {}, `Orphans untouched for ${days}+ days; costs in ${currency || 'the configured currency'}`),
        h('thead', {}, h('tr', {}, cols.map((c) => wrap(h('th', {scope: 'col', class: narrow.has(c) ? 'hide-narrow' : null}, c))))),
        h('tbody', {}, items.map((it) => {
          const key = `${it.kind}/${it.id}`;
          const box = cleanable(it) ? h('input', {type: 'checkbox', id: `sel-${it.kind}-${it.id}`,
            'aria-label': `Select ${it.kind} ${it.id}`, onchange: (ev) => {
              if (ev.target.checked) selected.add(key); else selected.delete(key);
              updateBulk();
            }}) : null;
          if (box) box.checked = selected.has(key);
          const idCell = it.kind === 'sandbox' ? h('a', {href: `#/sandbox/${encodeURIComponent(it.id)}`}, it.id) : h('code', {}, it.id);
          idCell.style.wordBreak = 'break-all'; // ids are 20 characters without a break
          return h('tr', {'data-kind': it.kind, 'data-id': it.id},
            h('td', {class: 'hide-narrow'}, box),
            h('td', {class: 'hide-narrow'}, it.kind),
            h('th', {scope: 'row'}, idCell),
            ctx.session.admin ? h('td', {}, it.owner || '') : null,
            h('td', {class: 'hide-narrow'}, badge(it.state)),
            h('td', {class: 'hide-narrow'}, it.template || ''),
            h('td', {title: it.last_active_at || it.created_at}, `${it.idle_days} d`),
            h('td', {class: 'hide-narrow', title: it.created_at}, ago(it.created_at)),
            h('td', {class: 'per-day-reserved'}, money(it.cost_per_day_reserved, '')),
            h('td', {class: 'per-day-active hide-narrow'}, money(it.cost_per_day_active, '')),
            h('td', {class: 'hide-narrow'}, `${money(it.cost_reserved, '')} / ${money(it.cost_active, '')}`),
            h('td', {}, cleanable(it)
              ? h('button', {type: 'button', class: 'danger cleanup', 'aria-label': `Clean up ${it.kind} ${it.id}`,
                onclick: () => cleanup([it])}, 'Clean up')
              : h('span', {class: 'help'}, 'remove with berth template rm')));
        }))));
    };

    const load = async () => {
      const r = await ctx.api('GET', `/v1/reports/orphans?days=${days}`, undefined, {signal: ctx.signal});
      items = (r.items || []).sort((a, b) => (b.cost_per_day_reserved || 0) - (a.cost_per_day_reserved || 0) || (a.id < b.id ? -1 : 1));
      draw();
    };
    // Refresh every 10 s unless a row's controls have the focus (a redraw
    // would take it away from a keyboard user).
    ctx.every(10000, async () => { if (!table.contains(document.activeElement)) await load(); });
  },
};

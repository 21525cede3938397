// Cost: usage over time per owner or per template, priced on both bases
// (reserved: wall-clock × reserved size; active: CPU and memory used, disk
// held), from GET /v1/usage/series. The chart is inline SVG drawn here (no
// chart library); its text alternative is the table under it. An owner's
// key sees its own usage, the admin every owner's.
// Route: #/cost[/<by>[/<basis>[/<range>]]].
import {h, fill, section} from '../dom.js';
import {money} from './orphans.js';

const NS = 'http://www.w3.org/2000/svg';
const PALETTE = ['#0b5cad', '#b3261e', '#1a7f37', '#9a6700', '#6f42c1', '#0f7b8a', '#bf3989', '#57606a'];
const DASHES = ['', '6 3', '2 3', '8 3 2 3', '4 4', '1 2', '10 4', '3 6'];
export const RANGES = {
  '24h': {label: 'Last 24 hours, hourly', step: '1h', from: '24h'},
  '7d': {label: 'Last 7 days, every 6 hours', step: '6h', from: '7d'},
  '30d': {label: 'Last 30 days, daily', step: '1d', from: '30d'},
};

// css styles el through the CSSOM (the console's CSP, style-src 'self',
// refuses style attributes) and returns it.
function css(el, text) {
  el.style.cssText = text;
  return el;
}

// svg builds an SVG element (h is for HTML only).
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined && v !== false) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// niceMax rounds a maximum up to 1, 2 or 5 × 10^n so the axis reads well.
export function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function label(t, stepSeconds) {
  const d = new Date(t);
  if (stepSeconds >= 86400) return d.toLocaleDateString([], {month: 'short', day: 'numeric'});
  return d.toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
}

// chart draws one line per series line on the chosen basis.
// width is the room the chart has, in CSS pixels: the drawing is made that
// wide (within 320-800), so its text keeps its size on a phone.
function chart(data, basis, currency, titleText, width) {
  const W = Math.round(Math.max(320, Math.min(800, width || 800))), H = W < 600 ? 240 : 300, L = 64, R = 28, T = 12, B = 36;
  const n = data.buckets.length;
  const max = niceMax(Math.max(0, ...data.lines.flatMap((l) => l[basis])));
  const x = (i) => L + (n <= 1 ? 0 : (i * (W - L - R)) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const desc = data.lines.length
    ? data.lines.map((l) => `${l.key}: ${money(basis === 'reserved' ? l.total_reserved : l.total_active, currency)} in total`).join('; ')
    : 'No usage in this range.';
  const grid = [0, 0.25, 0.5, 0.75, 1].map((f) => svg('g', {},
    svg('line', {x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), stroke: '#d5dae0', 'stroke-width': 1}),
    svg('text', {x: L - 6, y: y(max * f) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#5b6570'}, money(max * f, ''))));
  const every = Math.max(1, Math.ceil(n / Math.max(2, Math.floor((W - L - R) / 90))));
  const ticks = data.buckets.map((t, i) => (i % every ? null : svg('text', {x: x(i), y: H - B + 16, 'text-anchor': 'middle',
    'font-size': 11, fill: '#5b6570'}, label(t, data.step_seconds))));
  const lines = data.lines.map((l, k) => {
    const pts = l[basis].map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    const color = PALETTE[k % PALETTE.length];
    return svg('g', {class: 'series', 'data-key': l.key},
      svg('polyline', {points: pts, fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-dasharray': DASHES[k % DASHES.length] || null}),
      l[basis].map((v, i) => (v > 0 ? svg('circle', {cx: x(i), cy: y(v), r: 2.5, fill: color},
        svg('title', {}, `${l.key}, ${new Date(data.buckets[i]).toLocaleString()}: ${money(v, currency)}`)) : null)));
  });
  return css(svg('svg', {viewBox: `0 0 ${W} ${H}`, width: '100%', role: 'img', 'aria-labelledby': 'cost-chart-title cost-chart-desc',
    id: 'cost-chart', preserveAspectRatio: 'xMidYMid meet'},
  svg('title', {id: 'cost-chart-title'}, titleText),
  svg('desc', {id: 'cost-chart-desc'}, desc),
  grid,
  svg('line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#8a949e'}),
  ticks, lines), 'max-height: 22rem; display: block');
}

function legend(data) {
  return css(h('ul', {class: 'row', id: 'cost-legend'},
    data.lines.map((l, k) => css(h('li', {'data-key': l.key},
      svg('svg', {width: 28, height: 10, 'aria-hidden': 'true', focusable: 'false'},
        svg('line', {x1: 0, x2: 28, y1: 5, y2: 5, stroke: PALETTE[k % PALETTE.length], 'stroke-width': 3,
          'stroke-dasharray': DASHES[k % DASHES.length] || null})),
      l.key), 'display: flex; align-items: center; gap: .35rem'))), 'list-style: none; padding: 0; margin: .5rem 0');
}

export default {
  id: 'cost',
  title: 'Cost',
  nav: true,
  render(el, ctx) {
    const [by0, basis0, range0] = ctx.args;
    const state = {
      by: by0 === 'template' ? 'template' : 'owner',
      basis: basis0 === 'active' ? 'active' : 'reserved',
      range: RANGES[range0] ? range0 : '24h',
    };
    let data = null;
    let currency = '';
    const go = () => ctx.navigate(`#/cost/${state.by}/${state.basis}/${state.range}`);

    const bySel = h('select', {id: 'c-by', onchange: (ev) => { state.by = ev.target.value; go(); }},
      ['owner', 'template'].map((v) => h('option', {value: v, selected: state.by === v}, `per ${v}`)));
    const rangeSel = h('select', {id: 'c-range', onchange: (ev) => { state.range = ev.target.value; go(); }},
      Object.entries(RANGES).map(([k, r]) => h('option', {value: k, selected: state.range === k}, r.label)));
    const basisRadio = (v, text) => {
      const input = h('input', {type: 'radio', name: 'c-basis', id: `c-basis-${v}`, value: v,
        onchange: () => { state.basis = v; draw(); }});
      input.checked = state.basis === v;
      return css(h('label', {for: `c-basis-${v}`}, input, text),
        'display: inline-flex; gap: .3rem; align-items: center; margin-right: 1rem; font-weight: 400');
    };
    const basis = css(h('fieldset', {id: 'c-basis'},
      css(h('legend', {}, 'Basis'), 'font-weight: 600; font-size: .9rem'),
      basisRadio('reserved', 'Reserved (wall-clock × size)'), basisRadio('active', 'Active (used)')),
    'border: 1px solid #d5dae0; border-radius: 4px; padding: .3rem .6rem; margin: 0');
    const controls = h('div', {class: 'filters', role: 'group', 'aria-label': 'Chart options'},
      h('div', {class: 'field'}, h('label', {for: 'c-by'}, 'Group'), bySel),
      h('div', {class: 'field'}, h('label', {for: 'c-range'}, 'Range'), rangeSel),
      basis);
    const chartBox = h('div', {id: 'cost-chart-box'});
    const tableBox = h('div', {class: 'scroll', id: 'cost-table-box'});
    const note = h('p', {class: 'help', id: 'cost-note'});
    fill(el, h('h1', {}, 'Cost'),
      section('Usage over time', 'h-cost-chart', controls, note, chartBox),
      section('Totals', 'h-cost-totals', tableBox));

    const draw = () => {
      if (!data) return;
      const basisName = state.basis === 'reserved' ? 'reserved basis' : 'active basis';
      const title = `Cost per ${state.by}, ${basisName}, ${RANGES[state.range].label.toLowerCase()}${currency ? ` (${currency})` : ''}`;
      note.textContent = ctx.session.admin ? 'Every owner (admin key).' : `Your own usage (${ctx.session.owner}).`;
      if (!data.lines.length) {
        fill(chartBox, h('p', {id: 'cost-empty'}, 'No metered usage in this range yet.'));
      } else {
        fill(chartBox, chart(data, state.basis, currency, title, chartBox.clientWidth), legend(data));
      }
      const head = ['Total reserved', 'Total active'];
      const open = !!(tableBox.querySelector('details') || {}).open; // kept across refreshes
      fill(tableBox, h('table', {class: 'grid', id: 'cost-totals'},
        h('caption', {}, `Totals per ${state.by}, ${RANGES[state.range].label.toLowerCase()}${currency ? `, ${currency}` : ''}`),
        h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, state.by === 'owner' ? 'Owner' : 'Template'),
          head.map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', {}, data.lines.map((l) => h('tr', {'data-key': l.key},
          h('th', {scope: 'row'}, l.key), h('td', {class: 'total-reserved'}, money(l.total_reserved, '')),
          h('td', {class: 'total-active'}, money(l.total_active, '')))))),
      h('details', {open}, h('summary', {}, 'Every bucket (the chart as a table)'),
        h('div', {class: 'scroll'}, h('table', {class: 'grid', id: 'cost-buckets'},
          h('caption', {}, `${title}, per bucket`),
          h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, 'Bucket'), data.lines.map((l) => h('th', {scope: 'col'}, l.key)))),
          h('tbody', {}, data.buckets.map((t, i) => h('tr', {},
            h('th', {scope: 'row'}, new Date(t).toLocaleString()),
            data.lines.map((l) => h('td', {}, money(l[state.basis][i], ''))))))))));
    };

    // Redraw at the new width when the window is resized (a phone turned).
    let resizeTimer = null;
    const onResize = () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(draw, 150); };
    window.addEventListener('resize', onResize);
    ctx.signal.addEventListener('abort', () => { window.removeEventListener('resize', onResize); clearTimeout(resizeTimer); });
    ctx.every(30000, async () => {
      const r = RANGES[state.range];
      data = await ctx.api('GET', `/v1/usage/series?by=${state.by}&step=${r.step}&from=${r.from}`, undefined, {signal: ctx.signal});
      currency = (data.prices && data.prices.currency) || '';
      draw();
    });
  },
};

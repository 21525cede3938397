// Pools and templates: each warm pool's hits and misses (with the hit
// rate), claim latency p50/p99 and current vs target size (GET /v1/pools,
// admin key); every template with its last build, and the build history
// (GET /v1/builds: imports, pulls, Dockerfile builds with duration, result
// and fingerprint). Refreshed every 5 s.
import {h, fill, badge, ago, when, bytes, section} from '../dom.js';

export function rate(hits, misses) {
  const n = (hits || 0) + (misses || 0);
  return n ? `${Math.round((100 * (hits || 0)) / n)}%` : '–';
}

export function micros(us) {
  if (!us) return '–';
  if (us < 1000) return `${us} µs`;
  if (us < 1e6) return `${(us / 1000).toFixed(us < 1e4 ? 1 : 0)} ms`;
  return `${(us / 1e6).toFixed(2)} s`;
}

function millis(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} m ${Math.round((ms % 60000) / 1000)} s`;
}

const short = (fp) => (fp ? fp.slice(0, 12) : '');
// th is a column header that may wrap (set through the CSSOM: the
// console's CSP refuses style attributes); narrow ones hide on a phone.
function th(c, narrow) {
  const el = h('th', {scope: 'col', class: narrow ? 'hide-narrow' : null}, c);
  el.style.whiteSpace = 'normal';
  return el;
}

export default {
  id: 'pools',
  title: 'Pools & templates',
  nav: true,
  render(el, ctx) {
    let filter = ctx.args[0] || '';
    const poolsBox = h('div', {class: 'scroll', id: 'pools-box'});
    const tplBox = h('div', {class: 'scroll', id: 'templates-box'});
    const buildsBox = h('div', {class: 'scroll', id: 'builds-box'});
    const tplSel = h('select', {id: 'b-template', onchange: (ev) => { filter = ev.target.value; loadBuilds(); }});
    fill(el, h('h1', {}, 'Pools & templates'),
      section('Warm pools', 'h-pools', poolsBox),
      section('Templates', 'h-templates', tplBox),
      section('Build history', 'h-builds',
        h('div', {class: 'filters'}, h('div', {class: 'field'}, h('label', {for: 'b-template'}, 'Template'), tplSel)),
        buildsBox));

    const drawPools = (pools) => {
      if (!pools) { fill(poolsBox, h('p', {class: 'help'}, 'Warm pools are shown to the admin key.')); return; }
      if (!pools.length) { fill(poolsBox, h('p', {}, 'No warm pools configured (berth pool set TEMPLATE --size N).')); return; }
      fill(poolsBox, h('table', {class: 'grid', id: 'pools'},
        h('caption', {}, 'Hit rate = hits / (hits + misses) since the server started; claim latency over the latest claims'),
        h('thead', {}, h('tr', {}, th('Template'), th('State'), th('Ready / target'), th('Starting', true), th('Hits', true),
          th('Misses', true), th('Hit rate'), th('Claim p50'), th('Claim p99'), th('Idle memory', true), th('Fingerprint', true))),
        h('tbody', {}, pools.map((p) => h('tr', {'data-template': p.template},
          h('th', {scope: 'row'}, p.template),
          h('td', {}, badge(p.state), p.error ? h('div', {class: 'error'}, p.error) : null,
            p.retry_at && !p.retry_at.startsWith('0001-') ? h('div', {class: 'help'}, `retry ${ago(p.retry_at)}`) : null),
          h('td', {class: 'size'}, `${p.ready} / ${p.target}${p.auto ? ` (auto ${p.min}–${p.max})` : ''}`),
          h('td', {class: 'hide-narrow'}, p.starting),
          h('td', {class: 'hits hide-narrow'}, p.hits), h('td', {class: 'misses hide-narrow'}, p.misses),
          h('td', {class: 'hit-rate', title: `${p.hits} hits, ${p.misses} misses`}, rate(p.hits, p.misses)),
          h('td', {class: 'p50'}, micros(p.claim_p50_us)), h('td', {class: 'p99'}, micros(p.claim_p99_us)),
          h('td', {class: 'hide-narrow'}, bytes(p.idle_memory_bytes)),
          h('td', {class: 'hide-narrow'}, h('code', {title: p.fingerprint || ''}, short(p.fingerprint))))))));
    };

    const drawTemplates = (tpls, lastBuild) => {
      if (!tpls.length) { fill(tplBox, h('p', {}, 'No templates.')); return; }
      fill(tplBox, h('table', {class: 'grid', id: 'templates'},
        h('caption', {}, `${tpls.length} ${tpls.length === 1 ? 'template' : 'templates'}`),
        h('thead', {}, h('tr', {}, th('Template'), th('State'), th('Last build'), th('Layers', true), th('Fingerprint', true),
          th('Source', true), th('Updated'))),
        h('tbody', {}, tpls.map((t) => {
          const b = lastBuild[t.name];
          return h('tr', {'data-template': t.name},
            h('th', {scope: 'row'}, h('a', {href: `#/pools/${encodeURIComponent(t.name)}`, 'aria-label': `Build history of ${t.name}`}, t.name)),
            h('td', {}, badge(t.state), t.progress && t.state === 'building' ? h('div', {class: 'help'}, t.progress) : null),
            h('td', {}, b ? `${b.result} in ${millis(b.ms)}, ${ago(b.ended_at)}` : '–'),
            h('td', {class: 'hide-narrow'}, (t.layers || []).length),
            h('td', {class: 'hide-narrow'}, h('code', {title: t.fingerprint || ''}, short(t.fingerprint))),
            h('td', {class: 'hide-narrow'}, t.source || ''),
            h('td', {title: t.updated_at}, ago(t.updated_at)));
        }))));
    };

    const drawBuilds = (builds) => {
      if (!builds.length) { fill(buildsBox, h('p', {}, filter ? `No builds of ${filter} recorded.` : 'No builds recorded.')); return; }
      fill(buildsBox, h('table', {class: 'grid', id: 'builds'},
        h('caption', {}, filter ? `Builds of ${filter}, newest first` : 'Every build, newest first'),
        h('thead', {}, h('tr', {}, th('Template'), th('Kind', true), th('Result'), th('Started'), th('Duration'),
          th('Fingerprint', true), th('Layers', true), th('Source / error', true))),
        h('tbody', {}, builds.map((b) => h('tr', {'data-seq': b.seq, 'data-template': b.template, 'data-result': b.result},
          h('th', {scope: 'row'}, b.template), h('td', {class: 'hide-narrow'}, b.kind),
          h('td', {class: 'result'}, h('span', {class: `badge ${b.result === 'ready' ? 'st-running' : 'st-failed'}`}, b.result)),
          h('td', {title: b.started_at}, when(b.started_at)), h('td', {}, millis(b.ms)),
          h('td', {class: 'hide-narrow'}, h('code', {title: b.fingerprint || ''}, short(b.fingerprint))),
          h('td', {class: 'hide-narrow'}, b.layers),
          h('td', {class: 'hide-narrow'}, b.error ? h('span', {class: 'error'}, b.error) : (b.source || '')))))));
    };

    let names = '';
    const loadBuilds = async () => {
      const q = filter ? `?template=${encodeURIComponent(filter)}&limit=100` : '?limit=100';
      const r = await ctx.api('GET', `/v1/builds${q}`, undefined, {signal: ctx.signal});
      drawBuilds(r.builds || []);
    };

    ctx.every(5000, async () => {
      const [pools, tpls, all] = await Promise.all([
        ctx.session.admin ? ctx.api('GET', '/v1/pools', undefined, {signal: ctx.signal}) : Promise.resolve(null),
        ctx.api('GET', '/v1/templates', undefined, {signal: ctx.signal}),
        ctx.api('GET', '/v1/builds?limit=200', undefined, {signal: ctx.signal}),
      ]);
      const lastBuild = {};
      for (const b of all.builds || []) if (!lastBuild[b.template]) lastBuild[b.template] = b;
      drawPools(pools);
      drawTemplates(tpls || [], lastBuild);
      const now = JSON.stringify((tpls || []).map((t) => t.name));
      if (now !== names && document.activeElement !== tplSel) {
        names = now;
        fill(tplSel, h('option', {value: ''}, 'all'),
          (tpls || []).map((t) => h('option', {value: t.name, selected: filter === t.name}, t.name)));
      }
      await loadBuilds();
    });
  },
};

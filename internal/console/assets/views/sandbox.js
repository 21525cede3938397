// One sandbox: its facts and actions (pause/resume/fork/snapshot/delete,
// each confirmed), the activity timeline (or, where the server has no
// activity route yet, its events), events, usage, a terminal over the PTY
// exec API, and a files browser with download and upload.
import {h, fill, badge, when, ago, mib, bytes, section} from '../dom.js';
import {connectShell} from '../term.js';

const enc = encodeURIComponent;

function facts(sb) {
  const r = sb.resources || {};
  const rows = [
    ['Owner', sb.owner], ['State', badge(sb.state)],
    ['Reason', sb.reason ? `${sb.reason}${sb.message ? ` — ${sb.message}` : ''}` : ''],
    ['Template', sb.template], ['Template id', sb.template_id ? h('code', {}, sb.template_id.slice(0, 19)) : ''],
    ['Runtime', sb.runtime],
    ['Resources', `${(r.cpu_millis || 0) / 1000} CPU · ${mib(r.memory_mib)} memory · ${mib(r.disk_mib)} disk · ${r.pids || 0} pids`],
    ['Created', `${when(sb.created_at)} (${ago(sb.created_at)})`],
    ['Started', sb.started_at ? when(sb.started_at) : ''],
    ['Expires', `${when(sb.expires_at)} (${ago(sb.expires_at)}), then ${sb.expiry_action || ''}`],
    ['Pause mode', sb.pause_mode ? `${sb.pause_mode}${sb.pause_mode_requested && sb.pause_mode_requested !== sb.pause_mode ? ` (asked ${sb.pause_mode_requested})` : ''}` : ''],
    ['Resumed from', sb.resumed_from || ''],
    ['Labels', Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ')],
  ];
  return h('dl', {class: 'facts', id: 'facts'}, rows.filter(([, v]) => v !== '' && v !== undefined).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

// activityLine is one entry of the timeline; exec entries show their argv
// and how they ended.
function activityLine(e) {
  let detail = e.summary || '';
  const d = e.data || {};
  if (e.kind === 'exec') {
    const argv = Array.isArray(d.argv) ? d.argv.join(' ') : '';
    const end = d.signal ? `signal ${d.signal}` : d.exit_code !== undefined && d.exit_code !== null ? `exit code ${d.exit_code}` : d.detached ? 'detached' : 'running';
    detail = [h('code', {}, argv || detail), ` → ${end}`, d.user ? ` as ${d.user}` : '',
      d.bytes_out !== undefined ? ` · out ${bytes(d.bytes_out)}` : ''];
  }
  return h('li', {'data-kind': e.kind, 'data-seq': e.seq},
    h('span', {class: 't'}, h('time', {datetime: e.time}, when(e.time))),
    h('span', {class: 'k'}, e.kind), h('span', {class: 'd'}, detail, e.actor ? h('span', {class: 'help'}, ` (${e.actor})`) : ''));
}

function eventLine(e) {
  const what = e.type === 'transition' ? `${e.from || '∅'} → ${e.to}` : e.type;
  return h('li', {'data-kind': e.type, 'data-seq': e.seq},
    h('span', {class: 't'}, h('time', {datetime: e.time}, when(e.time))),
    h('span', {class: 'k'}, e.type), h('span', {class: 'd'}, what, e.reason ? ` (${e.reason})` : '', e.message ? ` — ${e.message}` : '',
      e.actor ? h('span', {class: 'help'}, ` by ${e.actor}`) : ''));
}

function usageView(u) {
  if (!u) return h('p', {class: 'help'}, 'No usage recorded yet.');
  const s = (x) => `${Math.round(x || 0)} s`;
  return h('dl', {class: 'facts', id: 'usage'},
    h('dt', {}, 'CPU'), h('dd', {}, `${(u.cpu_seconds || 0).toFixed(1)} s`),
    h('dt', {}, 'Memory'), h('dd', {}, `avg ${mib(u.memory_avg_mib)}, peak ${mib(u.memory_peak_mib)}`),
    h('dt', {}, 'Time'), h('dd', {}, `running ${s(u.running_seconds)}, paused ${s(u.paused_seconds + (u.frozen_seconds || 0))}, stopped ${s(u.stopped_seconds)}`),
    h('dt', {}, 'Disk'), h('dd', {}, `${(u.disk_gib_hours || 0).toFixed(3)} GiB·h`),
    h('dt', {}, 'Cost'), h('dd', {}, `${(u.cost_reserved || 0).toFixed(4)} reserved · ${(u.cost_active || 0).toFixed(4)} active`));
}

function joinPath(dir, name) { return dir.endsWith('/') ? dir + name : `${dir}/${name}`; }
function parentOf(p) { const i = p.replace(/\/+$/, '').lastIndexOf('/'); return i <= 0 ? '/' : p.slice(0, i); }

export default {
  id: 'sandbox',
  title: 'Sandbox',
  nav: false,
  async render(el, ctx) {
    const id = ctx.args[0];
    if (!id) { ctx.navigate('#/fleet'); return undefined; }
    const base = `/v1/sandboxes/${enc(id)}`;
    const get = (path) => ctx.api('GET', path, undefined, {signal: ctx.signal});
    let sb = await get(base);
    document.title = `${id} · berth console`;

    const title = h('h1', {}, h('a', {href: '#/fleet'}, 'Fleet'), ' / ', h('code', {}, sb.id), h('span', {id: 'sb-state'}, badge(sb.state)));
    const factsBox = h('div', {}, facts(sb));
    const actions = h('div', {class: 'row', role: 'toolbar', 'aria-label': 'Sandbox actions'});
    const activityBox = h('div', {}, h('p', {class: 'help'}, 'Loading…'));
    const eventsBox = h('div', {}, h('p', {class: 'help'}, 'Loading…'));
    const usageBox = h('div', {}, h('p', {class: 'help'}, 'Loading…'));
    const termBox = h('div', {class: 'term-wrap', hidden: true});
    const termStatus = h('p', {class: 'help', id: 'term-status', 'aria-live': 'polite'});
    const termButton = h('button', {type: 'button', id: 'term-open', class: 'primary'}, 'Open terminal');
    const filesBox = h('div', {});
    fill(el, title,
      section('Facts', 'h-facts', actions, factsBox),
      h('div', {class: 'cols'},
        section('Activity', 'h-activity', activityBox),
        section('Events', 'h-events', eventsBox)),
      section('Terminal', 'h-terminal', h('div', {class: 'row'}, termButton, termStatus), termBox),
      section('Files', 'h-files', filesBox),
      section('Usage', 'h-usage', usageBox));

    // --- actions -----------------------------------------------------------
    const modeSel = h('select', {id: 'pause-mode'}, ['', 'freeze', 'memory', 'disk'].map((m) => h('option', {value: m}, m || 'default')));
    const act = async (label, question, fn) => {
      if (!(await ctx.confirm(question, label))) return;
      try {
        const msg = await fn();
        ctx.toast(msg || `${label}: done`);
        await refresh();
      } catch (e) {
        ctx.toast(`${label} failed: ${e.message}`, true);
      }
    };
    const btn = (idAttr, label, onclick, danger = false) => h('button', {type: 'button', id: idAttr, class: danger ? 'danger' : null, onclick}, label);
    const drawActions = () => fill(actions,
      h('label', {for: 'pause-mode'}, 'Pause mode'), modeSel,
      btn('act-pause', 'Pause', () => act('Pause', `Pause ${id}${modeSel.value ? ` (${modeSel.value})` : ''}?`,
        () => ctx.api('POST', `${base}/pause`, modeSel.value ? {mode: modeSel.value} : {}))),
      btn('act-resume', 'Resume', () => act('Resume', `Resume ${id}?`, () => ctx.api('POST', `${base}/resume`, {}))),
      btn('act-fork', 'Fork', () => act('Fork', `Fork ${id} into a new sandbox?`, async () => {
        const r = await ctx.api('POST', `${base}/fork`, {});
        const child = r && r.sandboxes && r.sandboxes[0];
        return child ? `forked: ${child.id}` : '';
      })),
      btn('act-snapshot', 'Snapshot', () => act('Snapshot', `Take a snapshot of ${id}?`, async () => {
        const snap = await ctx.api('POST', `${base}/snapshot`, {});
        return `snapshot ${snap.id}`;
      })),
      btn('act-delete', 'Delete', async () => {
        if (!(await ctx.confirm(`Delete ${id}? Its workspace is removed for good.`, 'Delete'))) return;
        try {
          await ctx.api('DELETE', base);
          ctx.toast(`deleted ${id}`);
          ctx.navigate('#/fleet');
        } catch (e) { ctx.toast(`Delete failed: ${e.message}`, true); }
      }, true));
    const syncActions = () => {
      const st = sb.state;
      const set = (i, on) => { const b = actions.querySelector(`#${i}`); if (b) b.disabled = !on; };
      set('act-pause', st === 'running');
      set('act-resume', st === 'paused');
      set('act-fork', st === 'running' || st === 'paused');
      set('act-snapshot', st === 'running' || st === 'paused' || st === 'stopped');
      termButton.disabled = st !== 'running' || !!shell;
    };
    drawActions();

    // --- timeline ----------------------------------------------------------
    // Both lists page forward from the last sequence number seen (after=),
    // append what is new and keep the newest KEEP entries on the page.
    const KEEP = 500;
    const appendTo = (box, id, label, items, line) => {
      let ol = box.querySelector('ol');
      if (!ol) {
        if (!items.length) { if (!box.dataset.empty) { box.dataset.empty = '1'; fill(box, h('p', {class: 'help'}, 'Nothing yet.')); } return; }
        ol = h('ol', {class: 'timeline', id, 'aria-label': label});
        fill(box, ol);
      }
      const follow = ol.scrollTop + ol.clientHeight >= ol.scrollHeight - 4;
      for (const it of items) ol.appendChild(line(it));
      while (ol.childNodes.length > KEEP) ol.firstChild.remove();
      if (follow) ol.scrollTop = ol.scrollHeight;
    };
    let hasActivity = true;
    let activityAfter = 0;
    let eventAfter = 0;
    const loadActivity = async () => {
      if (!hasActivity) return;
      for (let page = 0; page < 10; page++) {
        let r;
        try {
          r = await get(`${base}/activity?after=${activityAfter}&limit=1000`);
        } catch (e) {
          if (e.status === 404 || e.status === 501) {
            hasActivity = false;
            fill(activityBox, h('p', {class: 'help'}, 'This server has no activity timeline; the events are the record.'));
            return;
          }
          throw e;
        }
        const entries = (r && r.entries) || [];
        if (entries.length) activityAfter = entries[entries.length - 1].seq;
        if (r && r.next > activityAfter) activityAfter = r.next;
        appendTo(activityBox, 'activity', 'Activity, oldest first', entries.slice(-KEEP), activityLine);
        if (entries.length < 1000) return;
      }
    };
    const loadEvents = async () => {
      for (let page = 0; page < 10; page++) {
        const evs = (await get(`${base}/events?after=${eventAfter}&limit=1000`)) || [];
        if (evs.length) eventAfter = evs[evs.length - 1].seq;
        appendTo(eventsBox, 'events', 'Events, oldest first', evs.slice(-KEEP), eventLine);
        if (evs.length < 1000) return;
      }
    };
    const loadUsage = async () => {
      const u = await get(`/v1/usage?sandbox=${enc(id)}`);
      fill(usageBox, usageView(((u && u.sandboxes) || []).find((l) => l.sandbox_id === id)));
    };

    // --- terminal ----------------------------------------------------------
    let shell = null;
    const status = (msg, err) => { termStatus.textContent = msg; termStatus.classList.toggle('error', !!err); };
    termButton.addEventListener('click', () => {
      termBox.hidden = false;
      termBox.replaceChildren();
      shell = connectShell(ctx.api, id, termBox, {onStatus: status, signal: ctx.signal});
      syncActions();
      shell.done.catch((e) => status(`terminal failed: ${e.message}`, true)).finally(() => { shell = null; syncActions(); });
    });

    // --- files -------------------------------------------------------------
    let cwd = '/';
    const pathInput = h('input', {id: 'files-path', type: 'text', value: cwd, spellcheck: 'false'});
    const listing = h('div', {class: 'scroll', id: 'files-list'});
    const upload = h('input', {id: 'files-upload', type: 'file'});
    const listDir = async (dir) => {
      cwd = dir;
      pathInput.value = dir;
      let entries;
      try {
        entries = await ctx.api('POST', `${base}/fs/list`, {path: dir, depth: 1}, {signal: ctx.signal});
      } catch (e) {
        fill(listing, h('p', {class: 'error', role: 'alert'}, e.message));
        return;
      }
      entries.sort((a, b) => (a.type === 'dir') === (b.type === 'dir') ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1);
      fill(listing, h('table', {class: 'grid'},
        h('caption', {}, `${entries.length} entries in ${dir}`),
        h('thead', {}, h('tr', {}, ['Name', 'Size', 'Modified', 'Mode'].map((c, i) => h('th', {scope: 'col', class: i >= 2 ? 'hide-narrow' : null}, c)))),
        h('tbody', {},
          dir !== '/' ? h('tr', {}, h('td', {}, h('button', {type: 'button', class: 'link', onclick: () => listDir(parentOf(dir))}, '.. (up)')), h('td', {}), h('td', {class: 'hide-narrow'}), h('td', {class: 'hide-narrow'})) : null,
          entries.map((e) => h('tr', {'data-name': e.name},
            h('td', {}, e.type === 'dir'
              ? h('button', {type: 'button', class: 'link', onclick: () => listDir(joinPath(dir, e.name)), 'aria-label': `Open folder ${e.name}`}, `${e.name}/`)
              : h('a', {href: `${base}/files?path=${enc(joinPath(dir, e.name))}`, download: e.name, 'aria-label': `Download ${e.name}`}, e.name)),
            h('td', {}, e.type === 'dir' ? '' : bytes(e.size)),
            h('td', {class: 'hide-narrow'}, when(e.mod_time)),
            h('td', {class: 'hide-narrow'}, h('code', {}, e.permissions)))))));
    };
    fill(filesBox,
      h('form', {class: 'row', onsubmit: (ev) => { ev.preventDefault(); listDir(pathInput.value || '/'); }},
        h('label', {for: 'files-path'}, 'Folder'), pathInput, h('button', {type: 'submit'}, 'List')),
      h('form', {class: 'row', onsubmit: async (ev) => {
        ev.preventDefault();
        const f = upload.files && upload.files[0];
        if (!f) { ctx.toast('Choose a file to upload first', true); return; }
        const dest = joinPath(cwd, f.name);
        try {
          await ctx.api('PUT', `${base}/files?path=${enc(dest)}`, f);
          ctx.toast(`uploaded ${dest}`);
          upload.value = '';
          listDir(cwd);
        } catch (e) { ctx.toast(`Upload failed: ${e.message}`, true); }
      }}, h('label', {for: 'files-upload'}, 'Upload to this folder'), upload, h('button', {type: 'submit'}, 'Upload')),
      listing);

    // --- refresh -----------------------------------------------------------
    const refresh = async () => {
      sb = await get(base);
      fill(factsBox, facts(sb));
      fill(title.querySelector('#sb-state'), badge(sb.state));
      syncActions();
      await Promise.all([loadActivity(), loadEvents()]);
    };
    syncActions();
    if (sb.state === 'running') listDir('/');
    else fill(listing, h('p', {class: 'help'}, 'Files are browsable while the sandbox runs.'));
    ctx.every(2000, refresh);
    ctx.every(15000, loadUsage);
    return () => { if (shell) shell.close(); };
  },
};

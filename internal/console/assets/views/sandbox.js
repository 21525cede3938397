// One sandbox: facts, actions, events and activity, usage, terminal, files.
import {h, fill, badge, when} from '../dom.js';

export default {
  id: 'sandbox',
  title: 'Sandbox',
  nav: false,
  async render(el, ctx) {
    const id = ctx.args[0];
    if (!id) { ctx.navigate('#/fleet'); return; }
    const sb = await ctx.api('GET', `/v1/sandboxes/${encodeURIComponent(id)}`, undefined, {signal: ctx.signal});
    fill(el, h('h1', {}, 'Sandbox ', h('code', {}, sb.id), ' ', badge(sb.state)), h('p', {}, `created ${when(sb.created_at)}`));
  },
};

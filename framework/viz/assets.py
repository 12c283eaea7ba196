"""The page of the HTML view: inline CSS and JavaScript; __DATA__ becomes the plan's JSON."""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { --fb: #f28e2b; --err: #d62728; --hit: #ffd400; --sel: #111; --line: #d8d8d8; --muted: #666; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: #1d1d1d; background: #fafafa; }
header { padding: 10px 14px 6px; background: #fff; border-bottom: 1px solid var(--line); }
h1 { font-size: 16px; margin: 0 8px 4px 0; display: inline-block; }
#sub { color: var(--muted); }
h2 { font-size: 14px; margin: 0 0 6px; }
code, .mono, td.mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
#error { margin: 8px 0; padding: 8px 10px; border: 2px solid var(--err); background: #fff0f0; border-radius: 4px; }
#error .msg { white-space: pre-wrap; font-family: "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; }
#error .fix { margin-top: 4px; }
#error button, .link { color: #0645ad; background: none; border: none; padding: 0; cursor: pointer; font: inherit;
       text-decoration: underline; }
nav#phases { margin: 6px 0; }
nav#phases button { font: inherit; padding: 3px 10px; margin-right: 4px; border: 1px solid #bbb; background: #f3f3f3;
       border-radius: 4px; cursor: pointer; }
nav#phases button.on { background: #1d1d1d; color: #fff; border-color: #1d1d1d; }
table { border-collapse: collapse; }
#devices { margin: 4px 0; }
#devices th, #devices td { padding: 3px 7px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
/* the table fits a 1600 px window: headings wrap to two lines, an emulation's label goes under its device */
#devices th { font-weight: 600; color: #444; background: #f6f6f6; white-space: normal; vertical-align: bottom; }
#devices td:first-child, #devices th:first-child { text-align: left; }
#devices th:not(:first-child) { max-width: 7em; }
#devices td:first-child { white-space: normal; max-width: 20em; }
#devices .emu { display: block; font-size: 12px; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; vertical-align: -1px; margin-right: 5px;
       border: 1px solid rgba(0,0,0,.25); }
.bar { display: inline-block; width: 46px; height: 7px; background: #e7e7e7; margin-left: 5px; border-radius: 3px;
       position: relative; vertical-align: 1px; overflow: hidden; }
.bar i { position: absolute; left: 0; top: 0; bottom: 0; background: #6b9bd1; }
td.over { color: var(--err); font-weight: 700; } td.over .bar i { background: var(--err); }
.emu { color: #9a6700; font-weight: 600; }
#totals { margin: 4px 0 0; color: #333; }
#fallbacks { margin: 0; padding: 4px 14px; color: #333; }
#fallbacks:empty { display: none; }
#fallbacks li { margin: 1px 0; }
#fallbacks ul { margin: 2px 0; padding-left: 18px; }
#toolbar { position: sticky; top: 0; z-index: 5; display: flex; gap: 12px; align-items: center; flex-wrap: wrap;
       padding: 6px 14px; background: #f0f0f0; border-bottom: 1px solid var(--line); }
#search { width: 300px; padding: 4px 7px; font: inherit; }
#toolbar select, #toolbar button { font: inherit; }
#toolbar button { padding: 2px 9px; }
.legend { color: #444; font-size: 12px; }
.legend span { margin-right: 10px; white-space: nowrap; }
#timeline { display: flex; background: #fff; border-bottom: 1px solid var(--line); }
#labels { flex: 0 0 170px; border-right: 1px solid var(--line); background: #fcfcfc; }
#labels .axis { height: 26px; border-bottom: 1px solid #eee; color: var(--muted); font-size: 11px; padding: 6px 8px; }
#labels .lab { height: 64px; padding: 8px 8px; border-bottom: 1px solid #eee; overflow: hidden; }
#labels .lab b { display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#labels .lab small { color: var(--muted); }
#labels .lab.bad b { color: var(--err); }
#scroll { flex: 1 1 auto; overflow-x: auto; overflow-y: hidden; }
svg { display: block; }
.frag rect.b { stroke: rgba(0,0,0,.35); stroke-width: .6; cursor: pointer; }
.frag:hover rect.b { stroke: #000; stroke-width: 1.5; }
.frag.fb rect.b { stroke: var(--fb); stroke-width: 2; }
.frag.match rect.b { stroke: var(--hit); stroke-width: 3.5; }
.frag.err rect.b { stroke: var(--err); stroke-width: 3; }
.frag.errt rect.b { stroke: var(--err); stroke-width: 2; stroke-dasharray: 4 2; }
.frag.sel rect.b { stroke: var(--sel); stroke-width: 3; }
.frag text { font-size: 10.5px; pointer-events: none; fill: #1d1d1d; }
.copy { fill: none; stroke: #555; stroke-width: 1.1; opacity: .75; }
.copy:hover { stroke: #000; stroke-width: 2.2; opacity: 1; }
.copy.on { stroke: #0645ad; stroke-width: 2.2; opacity: 1; }
.clabel { font-size: 9.5px; fill: #333; paint-order: stroke; stroke: #fff; stroke-width: 3px; pointer-events: none; }
.tick { stroke: #ccc; }
.tlabel { font-size: 10px; fill: #666; }
.band { fill: #eef3fb; }
#results { max-height: 170px; overflow: auto; background: #fffbe0; border-bottom: 1px solid var(--line);
       padding: 4px 14px; }
#results ol { margin: 0; padding-left: 26px; }
#results li { cursor: pointer; } #results li:hover { text-decoration: underline; }
#detail { padding: 10px 14px 30px; }
#detail .hint { color: var(--muted); }
.facts { margin: 2px 0 8px; color: #333; }
.facts div { margin: 2px 0; }
#nodes { width: 100%; background: #fff; }
#nodes th, #nodes td { border-bottom: 1px solid #eee; padding: 3px 7px; text-align: left; vertical-align: top; }
#nodes th { position: sticky; top: 37px; background: #f6f6f6; z-index: 2; }
#nodes tr.fb td { background: #fff4e8; } #nodes tr.fb td:first-child { box-shadow: inset 4px 0 var(--fb); }
#nodes tr.err td { background: #ffe8e8; } #nodes tr.err td:first-child { box-shadow: inset 4px 0 var(--err); }
#nodes tr.errt td:first-child { box-shadow: inset 4px 0 #f0a0a0; }
#nodes tr.hit td { background: #fff7b3; }
#nodes td.why { max-width: 360px; }
#nodes td.ref { max-width: 420px; color: #8a4b00; }
#nodes td.reads { color: #555; max-width: 300px; }
.pill { display: inline-block; padding: 0 5px; border-radius: 8px; font-size: 11px; background: #eee; margin-right: 3px; }
.pill.fb { background: #ffe2c4; } .pill.err { background: var(--err); color: #fff; }
.note { color: #9a6700; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1><span id="sub"></span>
  <div id="error" hidden></div>
  <nav id="phases"></nav>
  <table id="devices"></table>
  <div id="totals"></div>
</header>
<div id="toolbar">
  <input id="search" type="search" placeholder="search a node or tensor name (Enter: next)" autocomplete="off">
  <span id="count"></span>
  <label>zoom to <select id="layer"></select></label>
  <label>size by <select id="sizeby">
    <option value="nodes">node count</option><option value="cost">estimated cost</option>
    <option value="time">measured time</option></select></label>
  <span><button id="zout" title="zoom out">&minus;</button> <button id="zin" title="zoom in (or Ctrl+wheel)">+</button>
    <button id="fit">fit</button></span>
  <span class="legend" id="legend"></span>
</div>
<div id="timeline"><div id="labels"></div><div id="scroll"><svg id="svg" xmlns="http://www.w3.org/2000/svg"></svg></div></div>
<div id="results" hidden></div>
<div id="fallbacks"></div>
<section id="detail"><p class="hint">Click a fragment (a block) to list its nodes: op, shape, dtype, why it runs
on its device, and every refusal.</p></section>
<script type="application/json" id="plan-data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("plan-data").textContent);
const AXIS = 26, LANE = 64, TOP = 14, BH = 36, GAP = 2, MINW = 3, PAD = 8;
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const laneIndex = Object.fromEntries(D.lanes.map((l, i) => [l.name, i]));
const colour = Object.fromEntries(D.lanes.map((l) => [l.name, l.colour]));
let P = null, phaseNo = 0, scale = 1, sizeBy = "nodes", selected = -1, hitNode = -1;
let matches = [], matchAt = -1, matchFrags = new Set();

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB"]; let i = 0;
  while (n >= 1024 && i < 3) { n /= 1024; i++; }
  return i ? n.toFixed(1) + " " + u[i] : n + " B";
}
function num(n) { return n >= 1e9 ? (n / 1e9).toFixed(2) + " G" : n >= 1e6 ? (n / 1e6).toFixed(1) + " M"
                  : n >= 1e3 ? (n / 1e3).toFixed(1) + " k" : String(n); }
function shape(s) { return "[" + s.join(", ") + "]"; }

// -- phases -------------------------------------------------------------------------------
function preparePhase(p) {
  if (p.ready) return;
  p.fragOf = new Int32Array(p.nodes.length);
  p.fragments.forEach((f) => { for (let i = f.start; i < f.start + f.nodes; i++) p.fragOf[i] = f.index; });
  p.index = Object.fromEntries(p.nodes.map((n, i) => [n.name, i]));
  p.errNodes = new Set(((p.marks || {}).nodes || []).map((n) => p.index[n]));
  p.errFrags = new Set((p.marks || {}).fragments || []);
  p.tensorNodes = new Set(((p.marks || {}).tensor_nodes || []).map((n) => p.index[n]));
  p.tensorFrags = new Set([...p.tensorNodes].map((i) => p.fragOf[i]));
  p.layers = [];
  const seen = new Map();
  p.layer.forEach((l, i) => { if (l >= 0) { if (!seen.has(l)) seen.set(l, [i, i]); else seen.get(l)[1] = i; } });
  p.layerSpan = seen;
  p.layers = [...seen.keys()].sort((a, b) => a - b);
  const groups = new Map();
  for (const f of p.fragments) for (const c of f.copies_in) {
    if (c.fragment === null || c.fragment === undefined) continue;
    const k = c.fragment + ">" + f.index;
    if (!groups.has(k)) groups.set(k, {src: c.fragment, dst: f.index, bytes: 0, tensors: []});
    const g = groups.get(k); g.bytes += c.bytes; g.tensors.push(c.tensor);
  }
  p.copyGroups = [...groups.values()];
  p.ready = true;
}

function selectPhase(k) {
  phaseNo = k; P = D.phases[k]; preparePhase(P); selected = -1; hitNode = -1;
  document.querySelectorAll("nav#phases button").forEach((b, i) => b.classList.toggle("on", i === k));
  const sel = $("layer");
  sel.innerHTML = '<option value="">whole graph</option>' + P.layers.map((l) => `<option value="${l}">layer ${l}</option>`).join("");
  const timeOpt = $("sizeby").querySelector('option[value="time"]');
  timeOpt.disabled = !P.fragments.some((f) => f.seconds !== undefined);
  if (timeOpt.disabled && sizeBy === "time") { sizeBy = "nodes"; $("sizeby").value = "nodes"; }
  renderDevices(); renderFallbacks(); renderLabels();
  fit(); runSearch();
  $("detail").innerHTML = '<p class="hint">Click a fragment (a block) to list its nodes: op, shape, dtype, why it runs on its device, and every refusal.</p>';
}

// -- header -------------------------------------------------------------------------------
function budgetCell(used, limit, fmt, bad) {
  const f = fmt || String;
  if (limit === null || limit === undefined) return `<td${bad ? ' class="over"' : ""}>${f(used)} <small>/ no limit</small></td>`;
  const frac = Math.min(1, used / Math.max(limit, 1));
  const over = used > limit || bad;
  return `<td class="${over ? "over" : ""}" title="${esc(f(used) + " of " + f(limit))}">${f(used)} / ${f(limit)}` +
         `<span class="bar"><i style="width:${(frac * 100).toFixed(1)}%"></i></span></td>`;
}
function renderDevices() {
  const m = P.marks || {};
  const copiedIn = {};
  for (const c of P.copies) copiedIn[c.dst_device] = (copiedIn[c.dst_device] || 0) + c.nbytes;
  const fbOn = {};
  for (const f of P.fallbacks) fbOn[f.device] = (fbOn[f.device] || 0) + 1;
  const timed = Object.keys(D.device_seconds || {}).length > 0;
  let h = "<tr><th>device</th><th>nodes</th><th>fragments</th><th>submissions</th><th>programs</th><th>copied in</th>" +
          "<th>fallbacks here</th><th title='distinct compiled programs over every phase shown'>live programs</th>" +
          "<th title='most commands chained in one submission'>chained commands</th><th title='weights + caches + activations, over every phase'>memory</th>" +
          "<th title='weights + caches + activations of this phase, against the budget'>memory this phase</th>" +
          (timed ? "<th>measured</th>" : "") + "</tr>";
  for (const lane of D.lanes) {
    const u = P.per_device[lane.name] || {nodes: 0, fragments: 0, submissions: 0, programs: 0};
    const b = D.budgets[lane.name] || {};
    const bad = (m.devices || []).includes(lane.name) ? m.budget : null;
    const mem = b.memory || {total: 0, weights: 0, caches: 0, activations: 0};
    const pm = (P.memory || {})[lane.name] || {total: 0, limit: null};
    h += `<tr data-device="${esc(lane.name)}"><td><span class="swatch" style="background:${lane.colour}"></span><b>${esc(lane.name)}</b>` +
         (lane.emulation ? ` <span class="emu">EMULATION of ${esc(lane.emulation)}</span>` : "") + `</td>` +
         `<td>${u.nodes}</td><td>${u.fragments}</td><td>${u.submissions}</td><td>${u.programs}</td>` +
         `<td>${bytes(copiedIn[lane.name] || 0)}</td><td>${fbOn[lane.name] || 0}</td>` +
         budgetCell(b.programs || 0, b.max_live_programs, null, bad === "programs") +
         budgetCell(b.chain || 0, b.max_chain, null, bad === "chain") +
         budgetCell(mem.total, b.memory_bytes, bytes, bad === "memory").replace("<td", `<td data-memory title="weights ${bytes(mem.weights)}, caches ${bytes(mem.caches)}, activations ${bytes(mem.activations)}"`) +
         budgetCell(pm.total || 0, pm.limit, bytes, false).replace("<td", `<td data-phase-memory title="${esc(pm.limit_source ? "budget " + pm.limit_source : "no budget")}"`) +
         (timed ? `<td>${D.device_seconds[lane.name] !== undefined ? D.device_seconds[lane.name].toFixed(3) + " s" : "-"}</td>` : "") + "</tr>";
  }
  $("devices").innerHTML = h;
}
function renderFallbacks() {
  // grouped by op, device and reason codes in Python (core/scheduler/fallbacks.py): one line per group
  const copies = P.copies.reduce((a, c) => a + c.nbytes, 0);
  const count = (n, w, pl) => `${n} ${n === 1 ? w : (pl || w + "s")}`;
  $("totals").innerHTML = `<div>${count(P.nodes.length, "node")} in ${count(P.fragments.length, "fragment")}; ` +
    `${count(P.copies.length, "copy", "copies")} between devices (${bytes(copies)}); ` +
    `${count(P.fallbacks.length, "fallback")}` + (P.fallback_groups.length ? " (listed below the timeline)" : "") + `</div>`;
  let h = "";
  if (P.fallback_groups.length) {
    h += "<ul>";
    for (const g of P.fallback_groups) {
      const why = Object.entries(g.reasons).map(([d, r]) => `${esc(d)}: ${esc(r)}`).join("; ");
      h += `<li><span class="pill fb">${g.count} &times; ${esc(g.op)} &rarr; ${esc(g.device)}</span> ${why} ` +
           `<button class="link" data-goto="${esc(g.first)}">first: ${esc(g.first)}</button></li>`;
    }
    h += "</ul>";
  }
  for (const line of P.fit_lines || []) h += `<div class="note">${esc(line)}</div>`;
  for (const note of D.notes || []) h += `<div class="note">note: ${esc(note)}</div>`;
  $("fallbacks").innerHTML = h;
}
function renderError() {
  const e = D.error; if (!e) return;
  const m = P ? P.marks || {} : {};
  const where = [];
  if (e.node) where.push(`node <button class="link" data-goto="${esc(e.node)}">${esc(e.node)}</button>`);
  if (e.tensor) where.push(`tensor <button class="link" data-search="${esc(e.tensor)}">${esc(e.tensor)}</button>`);
  if (e.devices && e.devices.length) where.push("device" + (e.devices.length > 1 ? "s " : " ") + e.devices.map(esc).join(", "));
  if (e.limit) where.push("limit " + esc(e.limit));
  const el = $("error");
  el.hidden = false;
  el.innerHTML = `<b>Reservation failed</b> <span class="pill err">${esc(e.code)}</span> at ${where.join("; ") || "(nothing named)"}` +
                 `<div class="msg">${esc(e.message)}</div>`;
}

// -- timeline -----------------------------------------------------------------------------
function units() {
  return P.fragments.map((f) => sizeBy === "cost" ? Math.max(f.cost, 1) : sizeBy === "time" ? Math.max(f.seconds || 0, 1e-7) : f.nodes);
}
function nodeFrac(i) {      // where node i starts inside its fragment, 0..1
  const f = P.fragments[P.fragOf[i]];
  if (sizeBy === "cost" && f.cost > 0) {
    let c = 0; for (let j = f.start; j < i; j++) c += P.cost[j];
    return c / f.cost;
  }
  return (i - f.start) / f.nodes;
}
function layout(s) {
  const u = units(); const fx = new Float64Array(u.length), fw = new Float64Array(u.length);
  let x = PAD;
  for (let i = 0; i < u.length; i++) { fx[i] = x; fw[i] = Math.max(MINW, u[i] * s); x += fw[i] + GAP; }
  return {fx, fw, width: x + PAD};
}
let L = null;
function nodeX(i, lay) { lay = lay || L; const f = P.fragOf[i]; return lay.fx[f] + lay.fw[f] * nodeFrac(i); }
function viewW() { return Math.max(200, $("scroll").clientWidth); }
function fitScale(want, span) {   // scale at which span(layout) == want px
  let lo = 1e-12, hi = 1e6;
  for (let k = 0; k < 60; k++) { const mid = Math.sqrt(lo * hi); if (span(layout(mid)) > want) hi = mid; else lo = mid; }
  return lo;
}
function fit() { scale = fitScale(viewW() - 2, (l) => l.width); render(); $("scroll").scrollLeft = 0; $("layer").value = ""; }
function zoomBy(k, anchorPx) {
  const sc = $("scroll"); const a = anchorPx === undefined ? sc.clientWidth / 2 : anchorPx;
  const frac = (sc.scrollLeft + a) / L.width;
  if (k > 1 && L.width * k > 3e6) return;       // browsers stop drawing very wide pictures
  scale *= k; render(); sc.scrollLeft = frac * L.width - a;
}
function zoomToLayer(l) {
  if (l === "") { fit(); return; }
  const [a, b] = P.layerSpan.get(+l);
  const end = (lay) => { const f = P.fragOf[b]; return (b + 1 < P.nodes.length && P.fragOf[b + 1] === f) ? nodeX(b + 1, lay) : lay.fx[f] + lay.fw[f]; };
  scale = fitScale(viewW() * 0.92, (lay) => end(lay) - nodeX(a, lay));
  render();
  $("scroll").scrollLeft = nodeX(a) - viewW() * 0.04;
}
function laneY(name) { return AXIS + laneIndex[name] * LANE; }

function render() {
  L = layout(scale);
  const H = AXIS + D.lanes.length * LANE + 4;
  const parts = [];
  D.lanes.forEach((lane, k) => parts.push(`<rect class="lane" data-device="${esc(lane.name)}" x="0" y="${AXIS + k * LANE}" width="${L.width}" height="${LANE}" fill="${k % 2 ? "#fbfbfb" : "#ffffff"}"/>`));
  // layers: alternate bands on the axis, a tick and a label where there is room
  let lastLabel = -1e9;
  const spans = P.layers.map((l) => {
    const [a, b] = P.layerSpan.get(l);
    const f = P.fragOf[b];
    return [l, nodeX(a), (b + 1 < P.nodes.length && P.fragOf[b + 1] === f) ? nodeX(b + 1) : L.fx[f] + L.fw[f]];
  });
  spans.forEach(([l, x0, x1], k) => {
    if (k % 2 === 0) parts.push(`<rect class="band" x="${x0}" y="0" width="${Math.max(1, x1 - x0)}" height="${AXIS - 2}"/>`);
  });
  for (const [l, x0] of spans) {
    parts.push(`<line class="tick" x1="${x0}" x2="${x0}" y1="${AXIS - 8}" y2="${H}"/>`);
    if (x0 - lastLabel > 12 + 6.5 * String(l).length) {
      parts.push(`<text class="tlabel" x="${x0 + 2}" y="${AXIS - 9}">L${l}</text>`); lastLabel = x0;
    }
  }
  // copies: an arrow from the end of the fragment that made the tensor to the start of the one that reads it
  const labels = [];
  for (const g of P.copyGroups) {
    const s = P.fragments[g.src], d = P.fragments[g.dst];
    const ys = laneY(s.device), yd = laneY(d.device);
    const down = ys < yd;
    const x1 = L.fx[g.src] + L.fw[g.src], x2 = L.fx[g.dst];
    const y1 = down ? ys + TOP + BH : ys + TOP, y2 = down ? yd + TOP : yd + TOP + BH;
    const dx = Math.max(8, (x2 - x1) / 2);
    const title = `${g.tensors.length} tensor${g.tensors.length > 1 ? "s" : ""} copied ${s.device} → ${d.device}, ${bytes(g.bytes)}: ${g.tensors.join(", ")}`;
    parts.push(`<path class="copy" data-src="${g.src}" data-dst="${g.dst}" d="M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}" marker-end="url(#arrow)"><title>${esc(title)}</title></path>`);
    labels.push({x: (x1 + x2) / 2, y: (y1 + y2) / 2 + 3, text: bytes(g.bytes)});
  }
  // byte labels where they do not overlap (every arrow keeps its tooltip)
  labels.sort((a, b) => a.x - b.x);
  const lastRight = {};
  for (const l of labels) {
    const w = l.text.length * 5.6 + 4, key = Math.round(l.y);
    if (l.x - w / 2 > (lastRight[key] === undefined ? -1e9 : lastRight[key]) + 3) {
      parts.push(`<text class="clabel" x="${l.x}" y="${l.y}" text-anchor="middle">${l.text}</text>`);
      lastRight[key] = l.x + w / 2;
    }
  }
  // fragments
  for (const f of P.fragments) {
    const x = L.fx[f.index], w = L.fw[f.index], y = laneY(f.device) + TOP;
    const cls = ["frag"]; if (f.fallbacks) cls.push("fb"); if (P.errFrags.has(f.index)) cls.push("err");
    else if (P.tensorFrags.has(f.index)) cls.push("errt");
    if (matchFrags.has(f.index)) cls.push("match"); if (f.index === selected) cls.push("sel");
    const copied = f.copies_in.reduce((a, c) => a + c.bytes, 0);
    const tip = `#${f.index} on ${f.device}: ${f.nodes} nodes (${f.first} .. ${f.last}), ${f.commands} commands in ${f.submissions.length} submission(s)` +
      (copied ? `, ${bytes(copied)} copied in` : "") + (f.fallbacks ? `, ${f.fallbacks} fallbacks` : "") +
      (f.seconds !== undefined ? `, ${(f.seconds * 1000).toFixed(3)} ms in ${f.runs} run${f.runs === 1 ? "" : "s"}` : "") + `, est. cost ${num(f.cost)}`;
    let inner = `<rect class="b" x="${x}" y="${y}" width="${w}" height="${BH}" rx="2" fill="${colour[f.device]}"><title>${esc(tip)}</title></rect>`;
    if (w > 26) inner += `<text class="s" data-x="${x}" data-w="${w}" x="${x + 3}" y="${y + 13}">#${f.index}${w > 70 ? " · " + f.nodes + " nodes" : ""}</text>`;
    if (w > 60) {
      const room = Math.floor((w - 6) / 6.1);
      let t = f.first === f.last ? f.first : f.first + " … " + f.last;
      if (t.length > room) t = f.first.length > room - 1 ? f.first.slice(0, Math.max(0, room - 1)) + "…" : f.first + " …";
      inner += `<text class="s mono" data-x="${x}" data-w="${w}" x="${x + 3}" y="${y + 28}">${esc(t)}</text>`;
    }
    parts.push(`<g class="${cls.join(" ")}" data-index="${f.index}" data-device="${esc(f.device)}">${inner}</g>`);
  }
  // marks: refused nodes (fallbacks) as orange ticks, the error as a red triangle above its node
  for (const f of P.fallbacks) {
    const i = P.index[f.node]; const x = nodeX(i); const y = laneY(f.device) + TOP;
    parts.push(`<rect x="${x}" y="${y - 5}" width="2.5" height="5" fill="#f28e2b" pointer-events="none"/>`);
  }
  for (const i of P.errNodes) {
    if (i === undefined) continue;
    const n = P.nodes[i]; const x = nodeX(i); const y = laneY(n.device) + TOP;
    parts.push(`<path class="errmark" d="M${x - 6},${y - 12} L${x + 6},${y - 12} L${x},${y - 1} Z" fill="#d62728"><title>${esc("error [" + D.error.code + "] at " + n.name)}</title></path>`);
  }
  const svg = $("svg");
  svg.setAttribute("width", L.width); svg.setAttribute("height", H);
  stickyTexts = null;
  svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>` + parts.join("");
  if (!stickyFrame) stickyFrame = requestAnimationFrame(stickLabels);
}
// a block wider than the view keeps its label in sight while the timeline scrolls
let stickyTexts = null, stickyFrame = 0;
function stickLabels() {
  stickyFrame = 0;
  if (!stickyTexts) stickyTexts = [...document.querySelectorAll("#svg text.s")].map((t) => [t, +t.dataset.x, +t.dataset.w]);
  const left = $("scroll").scrollLeft + 3;
  for (const [t, x, w] of stickyTexts) {
    const want = Math.min(Math.max(x + 3, left), x + Math.max(3, w - 180));
    if (+t.getAttribute("x") !== want) t.setAttribute("x", want);
  }
}
$("scroll").addEventListener("scroll", () => { if (!stickyFrame) stickyFrame = requestAnimationFrame(stickLabels); });
function renderLabels() {
  const m = P.marks || {};
  let h = `<div class="axis">layers &rarr;</div>`;
  for (const lane of D.lanes) {
    const u = P.per_device[lane.name] || {nodes: 0, fragments: 0};
    const bad = (m.devices || []).includes(lane.name);
    h += `<div class="lab${bad ? " bad" : ""}" data-device="${esc(lane.name)}"><b><span class="swatch" style="background:${lane.colour}"></span>${esc(lane.name)}</b>` +
         `<small>${esc(lane.type)}${lane.emulation ? " · EMULATION" : ""} · ${u.nodes} nodes · ${u.fragments} frag.</small></div>`;
  }
  $("labels").innerHTML = h;
}
function restyle() {
  document.querySelectorAll("#svg g.frag").forEach((g) => {
    const i = +g.dataset.index;
    g.classList.toggle("sel", i === selected); g.classList.toggle("match", matchFrags.has(i));
  });
  document.querySelectorAll("#svg path.copy").forEach((p) => p.classList.toggle("on", +p.dataset.src === selected || +p.dataset.dst === selected));
}

// -- details ------------------------------------------------------------------------------
function selectFragment(i, nodeIndex) {
  selected = i; hitNode = nodeIndex === undefined ? -1 : nodeIndex;
  restyle(); renderDetail();
  const x = L.fx[i], w = L.fw[i], sc = $("scroll");
  if (x + w < sc.scrollLeft + 4 || x > sc.scrollLeft + sc.clientWidth - 4) sc.scrollLeft = Math.max(0, x - (w < sc.clientWidth / 2 ? sc.clientWidth / 3 : 20));
  if (hitNode >= 0) {
    const row = document.querySelector(`#nodes tr[data-i="${hitNode}"]`);
    if (row) row.scrollIntoView({block: "nearest"});
  }
}
function inputLine(f, name) {
  const c = f.copies_in.find((c) => c.tensor === name);
  if (c) return `<li><code>${esc(name)}</code> <span class="pill">copied from ${esc(c.from)} (#${c.fragment})</span> ${bytes(c.bytes)}</li>`;
  const leaf = P.leaves[name];
  if (leaf) return `<li><code>${esc(name)}</code> <span class="pill">${esc(leaf[0])}</span> ${esc(leaf[2])} ${shape(leaf[1])}, ${bytes(leaf[3])}</li>`;
  const i = P.index[name];
  if (i !== undefined) return `<li><code>${esc(name)}</code> <span class="pill">from #${P.fragOf[i]}, same device</span></li>`;
  return `<li><code>${esc(name)}</code></li>`;
}
function renderDetail() {
  if (selected < 0) return;
  const f = P.fragments[selected];
  const shared = (P.programs.find((p) => p.device === f.device && p.fragments.includes(f.index)) || {fragments: []}).fragments;
  const subs = f.submissions.map((s) => `[${s[0]}, ${s[1]})`).join(" ");
  let h = `<h2>Fragment #${f.index} on <span class="swatch" style="background:${colour[f.device]}"></span>${esc(f.device)} ` +
          `<small>— nodes ${f.start}–${f.start + f.nodes - 1} of ${P.nodes.length} (${esc(f.first)} .. ${esc(f.last)})</small></h2><div class="facts">` +
          `<div>${f.nodes} nodes, ${f.commands} commands in ${f.submissions.length} submission(s) ${esc(subs)}; estimated cost ${num(f.cost)}` +
          (f.seconds !== undefined ? `; <b>measured ${(f.seconds * 1000).toFixed(3)} ms</b> in ${f.runs} run${f.runs === 1 ? "" : "s"}` : "") + `</div>` +
          `<div>program <code>${esc(f.program)}</code>` + (shared.length > 1 ? `, shared by ${shared.length} fragments: ${shared.slice(0, 24).map((k) => "#" + k).join(" ")}${shared.length > 24 ? " …" : ""}` : "") + `</div>` +
          (P.errFrags.has(f.index) ? `<div style="color:var(--err)"><b>the reservation error [${esc(D.error.code)}] is here</b></div>` :
           P.tensorFrags.has(f.index) ? `<div style="color:var(--err)">reads or writes ${esc(P.marks.tensor)}, the tensor the reservation error [${esc(D.error.code)}] names</div>` : "") +
          `<details${f.inputs.length <= 12 ? " open" : ""}><summary>${f.inputs.length} inputs, ${f.copies_in.length} copied in (${bytes(f.copies_in.reduce((a, c) => a + c.bytes, 0))})</summary><ul>` +
          f.inputs.map((n) => inputLine(f, n)).join("") + `</ul></details>` +
          `<div>${f.outputs.length} outputs: ${f.outputs.map((n) => `<code>${esc(n)}</code>`).join(", ")}</div></div>`;
  h += `<table id="nodes"><thead><tr><th>#</th><th>node</th><th>op</th><th>shape</th><th>dtype</th><th>device</th><th>why here</th><th>refused by</th><th>reads</th></tr></thead><tbody>`;
  for (let i = f.start; i < f.start + f.nodes; i++) {
    const n = P.nodes[i];
    const cls = [n.refusals ? "fb" : "", P.errNodes.has(i) ? "err" : "", P.tensorNodes.has(i) ? "errt" : "",
                 i === hitNode ? "hit" : ""].filter(Boolean).join(" ");
    const ref = n.refusals ? Object.entries(n.refusals).map(([d, r]) => `<div><b>${esc(d)}</b>: ${esc(r)}</div>`).join("") : "";
    const err = P.errNodes.has(i) ? `<div><span class="pill err">${esc(D.error.code)}</span> ${esc(D.error.message.split("\n")[0].replace(/^\[[^\]]*\] /, ""))}</div>`
              : P.tensorNodes.has(i) ? `<div><span class="pill">reads or writes ${esc(P.marks.tensor)}</span></div>` : "";
    h += `<tr data-i="${i}" data-node="${esc(n.name)}" class="${cls}"><td>${i}</td><td class="mono">${esc(n.name)}</td><td>${esc(n.op)}</td>` +
         `<td class="mono">${shape(n.shape)}</td><td>${esc(n.dtype)}</td><td>${esc(n.device)}</td><td class="why">${err}${esc(n.reason)}</td>` +
         `<td class="ref">${ref}</td><td class="reads mono">${n.src.map(esc).join(", ")}</td></tr>`;
  }
  $("detail").innerHTML = h + "</tbody></table>";
}

// -- search -------------------------------------------------------------------------------
function runSearch() {
  const q = $("search").value.trim().toLowerCase();
  matches = []; matchAt = -1; matchFrags = new Set();
  const box = $("results");
  if (!q) { $("count").textContent = ""; box.hidden = true; restyle(); return; }
  P.nodes.forEach((n, i) => {
    if (n.name.toLowerCase().includes(q)) matches.push({i, kind: "node"});
    else { const t = n.src.find((s) => s.toLowerCase().includes(q)); if (t !== undefined) matches.push({i, kind: "reads", t}); }
  });
  matches.forEach((m) => matchFrags.add(P.fragOf[m.i]));
  $("count").textContent = `${matches.length} match${matches.length === 1 ? "" : "es"} in ${matchFrags.size} fragment${matchFrags.size === 1 ? "" : "s"}`;
  box.hidden = matches.length === 0;
  box.innerHTML = "<ol>" + matches.slice(0, 200).map((m, k) => {
    const n = P.nodes[m.i];
    return `<li data-k="${k}"><code>${esc(n.name)}</code> (${esc(n.op)}) ` +
           (m.kind === "reads" ? `reads <code>${esc(m.t)}</code> ` : "") + `— fragment #${P.fragOf[m.i]} on ${esc(n.device)}</li>`;
  }).join("") + "</ol>" + (matches.length > 200 ? `<div>… ${matches.length - 200} more</div>` : "");
  restyle();
}
function goMatch(k) {
  if (!matches.length) return;
  matchAt = (k + matches.length) % matches.length;
  const m = matches[matchAt]; selectFragment(P.fragOf[m.i], m.i);
}
function goNode(name) {
  const i = P.index[name]; if (i === undefined) return;
  selectFragment(P.fragOf[i], i);
}

// -- wiring -------------------------------------------------------------------------------
$("title").textContent = D.title;
$("sub").textContent = D.measured ? "— the plan that ran, with measured time per fragment" : (D.error ? "— a plan that failed reservation" : "— the reserved plan");
$("phases").innerHTML = D.phases.map((p, k) => `<button data-k="${k}">${esc(p.name)}</button>`).join("");
$("legend").innerHTML = D.lanes.map((l) => `<span><span class="swatch" style="background:${l.colour}"></span>${esc(l.name)}</span>`).join("") +
  `<span><span class="swatch" style="background:var(--fb)"></span>fallback</span>` + (D.error ? `<span><span class="swatch" style="background:var(--err)"></span>error</span>` : "") +
  `<span>&rarr; copy (bytes)</span>`;
$("phases").addEventListener("click", (e) => { const b = e.target.closest("button"); if (b) selectPhase(+b.dataset.k); });
$("svg").addEventListener("click", (e) => { const g = e.target.closest("g.frag"); if (g) selectFragment(+g.dataset.index); });
$("scroll").addEventListener("wheel", (e) => {
  if (!e.ctrlKey) return; e.preventDefault();
  zoomBy(e.deltaY < 0 ? 1.25 : 0.8, e.clientX - $("scroll").getBoundingClientRect().left);
}, {passive: false});
$("zin").onclick = () => zoomBy(2); $("zout").onclick = () => zoomBy(0.5); $("fit").onclick = fit;
$("layer").onchange = (e) => zoomToLayer(e.target.value);
$("sizeby").onchange = (e) => { sizeBy = e.target.value; fit(); };
let pending = 0;
$("search").addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(runSearch, 120); });
$("search").addEventListener("keydown", (e) => {
  if (e.key === "Enter") { clearTimeout(pending); if (!matches.length) runSearch(); goMatch(matchAt + (e.shiftKey ? -1 : 1)); }
  if (e.key === "Escape") { $("search").value = ""; runSearch(); }
});
$("results").addEventListener("click", (e) => { const li = e.target.closest("li"); if (li) goMatch(+li.dataset.k); });
document.addEventListener("click", (e) => {
  const t = e.target.closest("[data-goto]");
  if (t) { goNode(t.dataset.goto); return; }
  const s = e.target.closest("[data-search]");
  if (s) { $("search").value = s.dataset.search; runSearch(); goMatch(0); }
});
document.addEventListener("keydown", (e) => { if (e.key === "/" && document.activeElement !== $("search")) { e.preventDefault(); $("search").focus(); } });
window.addEventListener("resize", () => { if ($("layer").value === "") fit(); });
selectPhase(0);
renderError();
document.body.dataset.ready = "1";
</script>
</body>
</html>
"""

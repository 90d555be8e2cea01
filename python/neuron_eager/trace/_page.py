"""The HTML/CSS/JS of the self-contained report (filled in by html.py). No network: the
data is embedded as JSON and everything is drawn by the inline script, which also writes
what it rendered into the DOM (#timeline data-slices, generated table rows)."""

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:18px;margin:0 0 4px} h2{font-size:15px;margin:20px 0 6px}
#meta,#note{color:#555} #errors{color:#b00;font-weight:bold;white-space:pre-wrap}
#totals{display:grid;grid-template-columns:max-content max-content;gap:2px 16px;margin:8px 0}
#totals dt{color:#555} #totals dd{margin:0;font-variant-numeric:tabular-nums}
#timeline{border:1px solid #ccc;background:#fff;position:relative;user-select:none}
#timeline canvas{display:block;width:100%;cursor:grab}
#controls{margin:6px 0} #controls button{margin-right:4px}
#tip{position:absolute;pointer-events:none;background:#333;color:#fff;padding:4px 6px;
 border-radius:3px;font-size:12px;display:none;white-space:pre;z-index:2}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#eee;cursor:pointer} td.l,th.l{text-align:left}
tr.sel td{background:#fff3c4} tr.op-row{cursor:pointer}
details pre{margin:2px 0;text-align:left;font-size:11px}
#legend span{display:inline-block;padding:0 6px;margin:4px 4px 0 0;border-radius:2px}
#track-list{columns:3;margin:4px 0;padding-left:18px;color:#555}
#segments-legend,#guard-summary{color:#555;margin:4px 0}
</style></head><body>
<h1>__TITLE__</h1>
<div id="meta"></div><div id="errors"></div>
<dl id="totals"></dl>
<h2>Timeline</h2>
<div id="controls"><button id="zoom-in">zoom in</button><button id="zoom-out">zoom out</button>
<button id="zoom-reset">reset</button> <span id="view"></span>
<span> (mouse wheel zooms, drag pans, click an op row to highlight it)</span></div>
<div id="timeline"><canvas id="canvas"></canvas><div id="tip"></div></div>
<div id="legend"></div><div id="note"></div>
<ul id="track-list"></ul>
<h2>Top ops</h2><table id="ops-table"></table>
<h2>Segments</h2><table id="segments-table"></table><div id="segments-legend"></div>
<h2>Guard verdicts</h2><div id="guard-summary"></div><table id="guard-table"></table>
<h2>Syncs by cause</h2><table id="syncs-table"></table>
<h2>Fallbacks</h2><table id="fallbacks-table"></table>
<script id="trace-data" type="application/json">__DATA__</script>
<script>
"use strict";
window.onerror = function (msg, src, line) {
  var e = document.getElementById("errors");
  e.textContent += "report error: " + msg + " (line " + line + ")\n";
  document.body.dataset.error = msg;
};
var D = JSON.parse(document.getElementById("trace-data").textContent);
var $ = function (id) { return document.getElementById(id); };
function el(tag, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function fmtNs(ns) {
  if (ns === null || ns === undefined) return "-";
  var a = Math.abs(ns);
  if (a < 1e3) return ns.toFixed(0) + " ns";
  if (a < 1e6) return (ns / 1e3).toFixed(2) + " us";
  if (a < 1e9) return (ns / 1e6).toFixed(3) + " ms";
  return (ns / 1e9).toFixed(3) + " s";
}
function pct(x) { return (100 * x).toFixed(1) + "%"; }

// ---- header -------------------------------------------------------------------------
(function () {
  var m = D.meta, parts = [];
  ["mode", "policy", "engine_version", "torch_version", "cores", "started_at"].forEach(
    function (k) {
      var v = k === "policy" && D.policy_label ? D.policy_label : m[k];
      if (v !== undefined && v !== null)
        parts.push(k + "=" + (typeof v === "object" ? JSON.stringify(v) : v));
    });
  $("meta").textContent = parts.join("  ");
  var t = D.summary.totals, d = D.summary.device;
  var rows = [["ops dispatched", t.ops], ["ops executed", t.executed], ["events", t.events],
    ["duration", fmtNs(t.duration_ns)], ["host time", fmtNs(t.host_ns)],
    ["device time (per-op)", fmtNs(d.per_op_ns)], ["device time (fused)", fmtNs(d.fused_ns)],
    ["compile time", fmtNs(d.compile_ns)], ["syncs", t.sync_count + " (" +
    fmtNs(t.sync_wait_ns) + " waiting)"], ["fallbacks", t.fallbacks],
    ["segment keys", t.segment_keys], ["bytes per op", t.bytes_per_op === null ? "-" :
    t.bytes_per_op.toFixed(1)], ["complete", t.complete ? "yes" : "NO (not closed)"]];
  var G = D.summary.guard;
  if (G.verdicts || G.transitions)
    rows.push(["guard verdicts", G.verdicts + " (" + G.kept + " kept)"],
      ["guard demotions", G.demotions + " (" + G.undecided + " undecided)"],
      ["guard re-trials", G.retrials]);
  rows.forEach(function (r) {
    $("totals").appendChild(el("dt", r[0])); $("totals").appendChild(el("dd", r[1]));
  });
  if (D.shown_slices < D.total_slices)
    $("note").textContent = "Showing " + D.shown_slices + " of " + D.total_slices +
      " slices: the longest of each track (neuron-trace html --max-slices).";
})();

// ---- tables -------------------------------------------------------------------------
function makeTable(id, cols, rows, rowClass, rowId) {
  var t = $(id), head = el("tr");
  cols.forEach(function (c, i) {
    var th = el("th", c[0], c[2] ? "l" : "");
    th.onclick = function () { sortBy(i); };
    head.appendChild(th);
  });
  var thead = el("thead"); thead.appendChild(head); t.appendChild(thead);
  var body = el("tbody"); t.appendChild(body);
  var order = rows.map(function (_, i) { return i; }), dir = 1, last = -1;
  function fill() {
    body.textContent = "";
    order.forEach(function (i) {
      var r = rows[i], tr = el("tr", null, rowClass);
      tr.id = rowId(r, i); tr.dataset.index = i;
      cols.forEach(function (c) {
        var v = c[1](r), td = el("td", null, c[2] ? "l" : "");
        if (v instanceof Node) td.appendChild(v); else td.textContent = v;
        tr.appendChild(td);
      });
      if (rowClass === "op-row") tr.onclick = function () { highlight(r.name, tr); };
      body.appendChild(tr);
    });
    t.dataset.rows = rows.length;
  }
  function sortBy(ci) {
    var key = cols[ci][3] || cols[ci][1];
    dir = last === ci ? -dir : -1; last = ci;
    order.sort(function (a, b) {
      var x = key(rows[a]), y = key(rows[b]);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    fill();
  }
  fill();
}
var S = D.summary;
makeTable("ops-table", [
  ["op", function (o) { return o.name; }, 1], ["calls", function (o) { return o.calls; }],
  ["host total", function (o) { return fmtNs(o.host_total_ns); }, 0,
   function (o) { return o.host_total_ns; }],
  ["host avg", function (o) { return fmtNs(o.host_avg_ns); }, 0,
   function (o) { return o.host_avg_ns; }],
  ["device total", function (o) { return fmtNs(o.device_total_ns); }, 0,
   function (o) { return o.device_total_ns; }],
  ["device avg", function (o) { return fmtNs(o.device_avg_ns); }, 0,
   function (o) { return o.device_avg_ns; }],
  ["device %", function (o) { return pct(o.device_share); }, 0,
   function (o) { return o.device_share; }],
  ["fallbacks", function (o) { return o.fallbacks; }]],
  S.ops, "op-row", function (o, i) { return "op-row-" + i; });
makeTable("segments-table", [
  ["key", function (g) { return g.key_hex; }, 1], ["state", function (g) { return g.state; }, 1],
  ["length", function (g) { return g.length; }], ["count", function (g) { return g.count; }],
  ["hits", function (g) { return g.hits; }],
  ["per-op total", function (g) { return fmtNs(g.per_op_device_total_ns); }, 0,
   function (g) { return g.per_op_device_total_ns; }],
  ["per-op avg", function (g) { return fmtNs(g.per_op_device_avg_ns); }, 0,
   function (g) { return g.per_op_device_avg_ns; }],
  ["fused", function (g) { return g.fused_count; }],
  ["fused avg", function (g) { return g.fused_count ? fmtNs(g.fused_avg_ns) : "-"; }, 0,
   function (g) { return g.fused_avg_ns; }],
  ["speedup", function (g) {
    return g.speedup ? g.speedup.toFixed(2) + "x " + g.speedup_basis.charAt(0) : "-"; }, 0,
   function (g) { return g.speedup || 0; }],
  ["guard", function (g) { return g.verdict || "-"; }, 1],
  ["first ops", function (g) { return g.first_ops.join(" "); }, 1]],
  S.segments, "segment-row", function (g) { return "segment-row-" + g.key_hex; });
$("segments-legend").textContent = D.speedup_legend || "";
(function () {
  var G = S.guard, states = Object.keys(G.states).sort().map(function (k) {
    return G.states[k] + " " + k; }).join(", ");
  $("guard-summary").textContent = (G.verdicts || G.transitions) ?
    G.verdicts + " verdicts: " + G.kept + " kept, " + G.demotions + " demotions (" +
    G.undecided + " undecided), " + G.retrials + " re-trials; " + G.transitions +
    " state transitions" + (states ? "; current states: " + states : "") :
    "No guard events in this trace (guard off, eager mode, or an older engine).";
})();
makeTable("guard-table", [
  ["key", function (k) { return k.key_hex; }, 1],
  ["state", function (k) { return k.state || "-"; }, 1],
  ["verdict", function (k) { return k.verdict || "-"; }, 1],
  ["fused/per-op", function (k) { return k.ratio ? k.ratio.toFixed(3) : "-"; }, 0,
   function (k) { return k.ratio || 0; }],
  ["speedup", function (k) { return k.speedup ? k.speedup.toFixed(2) + "x" : "-"; }, 0,
   function (k) { return k.speedup || 0; }],
  ["fused period", function (k) { return k.verdicts ? fmtNs(k.fused_period_ns) : "-"; }, 0,
   function (k) { return k.fused_period_ns; }],
  ["per-op period", function (k) { return k.verdicts ? fmtNs(k.per_op_period_ns) : "-"; }, 0,
   function (k) { return k.per_op_period_ns; }],
  ["samples", function (k) { return k.samples; }],
  ["re-trials", function (k) { return k.retrials; }],
  ["demotions", function (k) { return k.demotions; }],
  ["verdicts", function (k) { return k.history.join(" ") || "-"; }, 1]],
  S.guard.keys, "guard-row", function (k) { return "guard-row-" + k.key_hex; });
makeTable("syncs-table", [
  ["cause", function (y) { return y.cause; }, 1], ["count", function (y) { return y.count; }],
  ["total wait", function (y) { return fmtNs(y.total_wait_ns); }, 0,
   function (y) { return y.total_wait_ns; }],
  ["avg wait", function (y) { return fmtNs(y.avg_wait_ns); }, 0,
   function (y) { return y.avg_wait_ns; }],
  ["max wait", function (y) { return fmtNs(y.max_wait_ns); }, 0,
   function (y) { return y.max_wait_ns; }],
  ["first stack", function (y) {
    if (!y.stack) return "-";
    var d = el("details"), lines = y.stack.trim().split("\n");
    d.appendChild(el("summary", lines[lines.length - 1]));
    d.appendChild(el("pre", y.stack)); return d;
  }, 1, function (y) { return y.stack; }]],
  S.syncs, "sync-row", function (y, i) { return "sync-row-" + i; });
makeTable("fallbacks-table", [
  ["op", function (f) { return f.op; }, 1], ["reason", function (f) { return f.reason; }, 1],
  ["count", function (f) { return f.count; }]],
  S.fallbacks, "fallback-row", function (f, i) { return "fallback-row-" + i; });

// ---- timeline -----------------------------------------------------------------------
var TL = $("timeline"), CV = $("canvas"), TIP = $("tip");
var NAMEW = 170, ROWH = 16, AXISH = 20, CTRH = 28;
var COLORS = {1: [210, 60], 2: [130, 50], 3: [0, 70], 12: [280, 55], 11: [30, 85]};
var span = Math.max(D.t1 - D.t0, 1), v0 = 0, v1 = span, hl = -1;
var layout = [], y = AXISH;
D.tracks.forEach(function (t) {
  var md = 0; for (var i = 0; i < t.d.length; i++) if (t.d[i] > md) md = t.d[i];
  t.maxd = md; t.y = y; t.h = (t.depth) * ROWH + 4; y += t.h; layout.push(t);
  $("track-list").appendChild(el("li", t.name + " (" + t.s.length + " slices)", "track"));
});
D.counters.forEach(function (c) {
  c.y = y; y += CTRH; c.max = Math.max.apply(null, c.v.concat([1]));
});
var HEIGHT = y + 4;
function hue(kind, label) {
  var c = COLORS[kind] || [200, 10];
  return "hsl(" + ((c[0] + (label * 37) % 40) % 360) + "," + c[1] + "%," +
    (kind === 1 ? 72 : 62) + "%)";
}
[[1, "dispatch (host)"], [2, "execute (device)"], [3, "sync (host wait)"],
 [12, "fused segment"], [11, "compile"]].forEach(function (p) {
  var s = el("span", p[1]); s.style.background = hue(p[0], 0); $("legend").appendChild(s);
});
function lowerBound(arr, x) {
  var lo = 0, hi = arr.length;
  while (lo < hi) { var m = (lo + hi) >> 1; if (arr[m] < x) lo = m + 1; else hi = m; }
  return lo;
}
function draw() {
  var W = Math.max(TL.clientWidth, 400), dpr = window.devicePixelRatio || 1;
  CV.width = W * dpr; CV.height = HEIGHT * dpr; CV.style.height = HEIGHT + "px";
  var g = CV.getContext("2d"); g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.fillStyle = "#fff"; g.fillRect(0, 0, W, HEIGHT);
  var plotW = W - NAMEW, scale = plotW / (v1 - v0), drawn = 0;
  g.font = "11px sans-serif"; g.textBaseline = "middle";
  g.strokeStyle = "#ddd"; g.fillStyle = "#666";
  for (var k = 0; k <= 5; k++) {  // axis
    var x = NAMEW + plotW * k / 5;
    g.beginPath(); g.moveTo(x, 0); g.lineTo(x, HEIGHT); g.stroke();
    g.fillText(fmtNs(v0 + (v1 - v0) * k / 5), Math.min(x + 2, W - 60), 10);
  }
  layout.forEach(function (t) {
    g.fillStyle = "#f4f4f4"; g.fillRect(0, t.y, NAMEW - 4, t.h - 2);
    g.fillStyle = "#333"; g.fillText(t.name.slice(0, 26), 4, t.y + 9);
    var lastPx = {}, i = lowerBound(t.s, v0 - t.maxd);
    for (; i < t.s.length && t.s[i] <= v1; i++) {
      var s = t.s[i], d = t.d[i];
      if (s + d < v0) continue;
      var x0 = NAMEW + Math.max(s - v0, 0) * scale;
      var x1 = NAMEW + Math.min(s + d - v0, v1 - v0) * scale, dep = t.p[i];
      if (x1 - x0 < 1) { if (lastPx[dep] !== undefined && x0 < lastPx[dep]) continue;
        x1 = x0 + 1; }
      lastPx[dep] = x1;
      var faded = hl >= 0 && t.l[i] !== hl;
      g.fillStyle = faded ? "#e4e4e4" : hue(t.k[i], t.l[i]);
      g.fillRect(x0, t.y + dep * ROWH, x1 - x0, ROWH - 2);
      if (x1 - x0 > 40) {
        g.fillStyle = faded ? "#aaa" : "#111";
        g.save(); g.beginPath(); g.rect(x0, t.y + dep * ROWH, x1 - x0, ROWH); g.clip();
        g.fillText(D.labels[t.l[i]], x0 + 2, t.y + dep * ROWH + 7); g.restore();
      }
      drawn++;
    }
  });
  D.counters.forEach(function (c) {
    g.fillStyle = "#f4f4f4"; g.fillRect(0, c.y, NAMEW - 4, CTRH - 2);
    g.fillStyle = "#333"; g.fillText(c.name.slice(0, 26), 4, c.y + 9);
    g.strokeStyle = "#c60"; g.beginPath();
    var base = c.y + CTRH - 3, hgt = CTRH - 6, prev = null;
    for (var i = 0; i < c.t.length; i++) {
      var x = NAMEW + (c.t[i] - v0) * scale, yy = base - hgt * c.v[i] / c.max;
      x = Math.max(NAMEW, Math.min(W, x));
      if (prev === null) g.moveTo(x, yy); else { g.lineTo(x, prev); g.lineTo(x, yy); }
      prev = yy;
    }
    if (prev !== null) g.lineTo(W, prev);
    g.stroke();
  });
  TL.dataset.slices = drawn;
  TL.dataset.totalSlices = D.shown_slices;
  TL.dataset.tracks = layout.length;
  TL.dataset.viewStart = Math.round(v0); TL.dataset.viewEnd = Math.round(v1);
  TL.dataset.highlight = hl >= 0 ? D.labels[hl] : "";
  $("view").textContent = "view " + fmtNs(v0) + " .. " + fmtNs(v1) + ", " + drawn +
    " slices drawn";
}
function zoom(f, at) {
  var c = at === undefined ? (v0 + v1) / 2 : at, w = Math.min((v1 - v0) * f, span * 4);
  w = Math.max(w, 10);
  v0 = c - (c - v0) * w / (v1 - v0); v1 = v0 + w; draw();
}
function timeAt(px) {
  var plotW = Math.max(TL.clientWidth, 400) - NAMEW;
  return v0 + (px - NAMEW) / plotW * (v1 - v0);
}
$("zoom-in").onclick = function () { zoom(0.5); };
$("zoom-out").onclick = function () { zoom(2); };
$("zoom-reset").onclick = function () { v0 = 0; v1 = span; draw(); };
CV.addEventListener("wheel", function (e) {
  e.preventDefault();
  var r = CV.getBoundingClientRect();
  zoom(e.deltaY > 0 ? 1.25 : 0.8, timeAt(e.clientX - r.left));
}, {passive: false});
var dragX = null;
CV.onmousedown = function (e) { dragX = e.clientX; CV.style.cursor = "grabbing"; };
window.addEventListener("mouseup", function () { dragX = null; CV.style.cursor = "grab"; });
CV.onmousemove = function (e) {
  var r = CV.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
  if (dragX !== null) {
    var dt = (dragX - e.clientX) / (Math.max(TL.clientWidth, 400) - NAMEW) * (v1 - v0);
    v0 += dt; v1 += dt; dragX = e.clientX; draw(); return;
  }
  var t = timeAt(px), hit = null;
  layout.forEach(function (tr) {
    if (py < tr.y || py >= tr.y + tr.h || px < NAMEW) return;
    var dep = Math.floor((py - tr.y) / ROWH), tol = 3 * (v1 - v0) / TL.clientWidth;
    for (var i = lowerBound(tr.s, t - tr.maxd - tol); i < tr.s.length && tr.s[i] <= t + tol; i++)
      if (tr.p[i] === dep && tr.s[i] + tr.d[i] + tol >= t) hit = [tr, i];
  });
  if (!hit) { TIP.style.display = "none"; return; }
  var tr = hit[0], i = hit[1];
  TIP.textContent = D.labels[tr.l[i]] + "\n" + (D.kinds[tr.k[i]] || tr.k[i]) + " on " +
    tr.name + "\nstart " + fmtNs(tr.s[i]) + "  duration " + fmtNs(tr.d[i]);
  TIP.style.left = (px + 12) + "px"; TIP.style.top = (py + 12) + "px";
  TIP.style.display = "block";
};
CV.onmouseleave = function () { TIP.style.display = "none"; };
function highlight(name, tr) {
  var idx = D.labels.indexOf(name);
  document.querySelectorAll("tr.op-row.sel").forEach(function (r) { r.classList.remove("sel"); });
  hl = idx === hl ? -1 : idx;
  if (hl >= 0) tr.classList.add("sel");
  draw();
}
window.addEventListener("resize", draw);
var hv = /view=([-0-9.e+]+),([-0-9.e+]+)/.exec(location.hash);  // #view=START,END (ns)
if (hv) { v0 = +hv[1]; v1 = Math.max(+hv[2], v0 + 10); }
draw();
document.body.dataset.rendered = "1";
</script></body></html>
"""

// SPDX-License-Identifier: Apache-2.0
// depot-memviz page: decodes the data depot-memviz embedded (tools/memviz/page_data.cpp)
// and draws the active-memory timeline, the reserved / allocated / fragmentation series and
// the segment map on <canvas>. After every draw it records what it drew as data-*
// attributes (read by tests/memviz/check.py).
(function () {
  'use strict';

  const D = JSON.parse(document.getElementById('memviz-data').textContent);
  const root = document.documentElement;
  const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
                   '#9c755f', '#bab0ac'];
  const STATE_NAMES = ['allocated', 'pending_free', 'free', 'unmapped', 'free, kept for reuse'];
  const STATE_COLORS = ['#2f6fb5', '#f28e2b', '#dfe3ea', '#ffffff', '#a6d8b4'];
  const DETAIL_MAX = 20000;  // draw single allocations when at most this many overlap the view
  const SHADES = 4;

  // ---------------------------------------------------------------- formatting
  function fmtBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let u = 0;
    let v = n;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    if (u === 0) return Math.round(v) + ' B';
    return (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2)) + ' ' + units[u];
  }
  function fmtTime(ns) {
    const a = Math.abs(ns);
    const f = (v, unit) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2)) + ' ' + unit;
    if (a < 1e3) return f(ns, 'ns');
    if (a < 1e6) return f(ns / 1e3, 'µs');
    if (a < 1e9) return f(ns / 1e6, 'ms');
    return f(ns / 1e9, 's');
  }
  function hex(v) { return '0x' + v.toString(16); }
  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function niceByteStep(raw) {
    if (!(raw > 0)) return 1;
    let unit = 1;
    while (raw / unit >= 1024) unit *= 1024;
    return niceStep(raw / unit) * unit;
  }
  function rgb(color) {
    const v = parseInt(color.slice(1), 16);
    return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  }
  function pack(r, g, b) { return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; }  // little-endian RGBA
  function shade(color, k) {
    const c = rgb(color);
    const t = k / (SHADES + 1);
    return pack(...c.map((x) => Math.round(x + (255 - x) * t * 0.9)));
  }

  // ---------------------------------------------------------------- decoding
  function bytesOf(b64) {
    const bin = atob(b64);
    const u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return u;
  }
  // LEB128 varints (zigzag for signed), as packed_stream writes them.
  function reader(b64, what) {
    const u = bytesOf(b64);
    let p = 0;
    function next() {
      let v = 0, m = 1, b;
      do {
        if (p >= u.length) throw new Error(what + ': packed data ends early');
        b = u[p++];
        v += (b & 127) * m;
        m *= 128;
      } while (b & 128);
      return v;
    }
    return {
      u: next,
      s() { const v = next(); return v % 2 ? -(v + 1) / 2 : v / 2; },
      end() { if (p !== u.length) throw new Error(what + ': ' + (u.length - p) + ' bytes left over'); },
    };
  }
  function lowerBound(arr, x, n) {  // first i with arr[i] >= x
    let lo = 0, hi = n;
    while (lo < hi) { const mid = (lo + hi) >>> 1; if (arr[mid] < x) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function upperBound(arr, x, n) {  // first i with arr[i] > x
    let lo = 0, hi = n;
    while (lo < hi) { const mid = (lo + hi) >>> 1; if (arr[mid] <= x) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function decodeTrace(T) {
    const n = T.allocations;
    const r = reader(T.alloc_data, 'allocations');
    const start = new Float64Array(n), end = new Float64Array(n), endEff = new Float64Array(n);
    const size = new Float64Array(n), req = new Float64Array(n), addr = new Float64Array(n);
    const stream = new Uint32Array(n), thread = new Uint32Array(n), flags = new Uint8Array(n);
    const sizeClass = new Uint8Array(n), streamClass = new Uint8Array(n);
    const limits = [4096, 65536, 1 << 20, 16 << 20, 256 << 20, 1 << 30];
    let s = 0, a = 0;
    for (let i = 0; i < n; i++) {
      s += r.u();
      start[i] = s;
      end[i] = s + r.u();
      endEff[i] = end[i] > s ? end[i] : s + 0.5;  // a zero lifetime still shows in its column
      size[i] = r.u();
      req[i] = size[i] - r.s();
      a += r.s();
      addr[i] = a;
      stream[i] = r.u();
      thread[i] = r.u();
      flags[i] = r.u();
      let c = 0;
      while (c < limits.length && size[i] > limits[c]) c++;
      sizeClass[i] = c;
      streamClass[i] = T.stream_class_of[stream[i]] || 0;
    }
    r.end();
    const startPS = new Float64Array(n + 1);
    for (let i = 0; i < n; i++) startPS[i + 1] = startPS[i] + size[i];
    const endOrder = new Uint32Array(n);
    for (let i = 0; i < n; i++) endOrder[i] = i;
    endOrder.sort((x, y) => endEff[x] - endEff[y]);
    const endSorted = new Float64Array(n), endPS = new Float64Array(n + 1);
    for (let k = 0; k < n; k++) {
      endSorted[k] = endEff[endOrder[k]];
      endPS[k + 1] = endPS[k] + size[endOrder[k]];
    }
    const K1 = T.size_classes.length, K2 = T.stream_classes.length, K = K1 + K2;
    const levels = T.levels.map((L) => {
      const B = L.buckets;
      const st = reader(L.stacks, 'stacks of level ' + B), se = reader(L.series, 'series of level ' + B);
      const stacks = new Float64Array(B * K), totals = new Float64Array(B), series = new Float64Array(B * 9);
      const prevK = new Float64Array(K), prevS = new Float64Array(9);
      for (let b = 0; b < B; b++) {
        let tot = 0;
        for (let k = 0; k < K; k++) {
          prevK[k] += st.s();
          stacks[b * K + k] = prevK[k];
          if (k < K1) tot += prevK[k];
        }
        totals[b] = tot;
        for (let s3 = 0; s3 < 3; s3++) {
          for (let q = 0; q < 3; q++) {
            prevS[q * 3 + s3] += se.s();
            series[b * 9 + s3 * 3 + q] = prevS[q * 3 + s3];
          }
        }
      }
      st.end();
      se.end();
      return { B, stacks, totals, series };
    });
    return { n, start, end, endEff, size, req, addr, stream, thread, flags, sizeClass, streamClass, startPS,
             endSorted, endPS, levels, K1, K2, K, span: Math.max(T.span_ns, 1) };
  }

  function decodeSnapshot(S) {
    const r = reader(S.data, 'snapshot');
    const segments = [];
    let a = 0;
    for (let i = 0; i < S.segments; i++) {
      a += r.s();
      const seg = { addr: a, size: r.u(), small: r.u() === 1, stream: r.u(), blocks: [] };
      const nb = r.u();
      let endAddr = a;
      for (let k = 0; k < nb; k++) {
        const b = { addr: endAddr + r.s() };
        b.size = r.u();
        b.req = b.size - r.s();
        b.state = r.u();
        b.off = b.addr - a;
        endAddr = b.addr + b.size;
        seg.blocks.push(b);
      }
      // The addresses the blocks tile: the mapped size, plus the holes (unmapped blocks) of
      // an expandable segment. Rows are drawn to this span.
      seg.span = Math.max(endAddr - a, seg.size, 1);
      segments.push(seg);
    }
    r.end();
    return segments;
  }

  const T = D.trace || null;
  const S = D.snapshot || null;
  const decodeStart = performance.now();
  const tr = T ? decodeTrace(T) : null;
  const segs = S ? decodeSnapshot(S) : null;
  root.dataset.decodeMs = String(Math.round(performance.now() - decodeStart));

  // ---------------------------------------------------------------- state
  const view = { a: 0, b: tr ? tr.span : 1 };
  let colorBy = 'size';
  const hash = new URLSearchParams(location.hash.slice(1));
  if (tr && hash.has('view')) {
    const [fa, fb] = hash.get('view').split(',').map(Number);
    if (fa >= 0 && fb > fa && fb <= 1) { view.a = fa * tr.span; view.b = fb * tr.span; }
  }
  if (hash.get('color') === 'stream') colorBy = 'stream';
  const minWidth = tr ? Math.max(10, tr.span / 1e8) : 1;

  function clampView() {
    const span = tr.span;
    let w = Math.min(Math.max(view.b - view.a, minWidth), span);
    let a = Math.min(Math.max(view.a, 0), span - w);
    view.a = a;
    view.b = a + w;
  }

  function classNames() { return colorBy === 'size' ? T.size_classes : T.stream_classes; }
  function classPalette() {
    const names = classNames();
    const out = new Uint32Array(names.length * SHADES);
    for (let c = 0; c < names.length; c++) {
      for (let s = 0; s < SHADES; s++) out[c * SHADES + s] = shade(PALETTE[c % PALETTE.length], s);
    }
    return out;
  }

  // ---------------------------------------------------------------- canvas helpers
  const M = { left: 74, right: 56, top: 8, bottom: 22 };
  function setup(canvas, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const cssWidth = Math.max(canvas.parentElement.clientWidth, 320);
    canvas.style.height = cssHeight + 'px';
    canvas.width = Math.round(cssWidth * dpr);
    canvas.height = Math.round(cssHeight * dpr);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const X0 = Math.round(M.left * dpr), Y0 = Math.round(M.top * dpr);
    const PW = Math.max(canvas.width - X0 - Math.round(M.right * dpr), 10);
    const PH = Math.max(canvas.height - Y0 - Math.round(M.bottom * dpr), 10);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = '11px system-ui, sans-serif';
    // The plot rectangle in CSS pixels of the canvas, for tests/memviz/interact.py: it moves
    // the mouse onto drawn columns and rows and must know where they are.
    canvas.dataset.plotLeft = String(X0 / dpr);
    canvas.dataset.plotTop = String(Y0 / dpr);
    canvas.dataset.plotWidth = String(PW / dpr);
    canvas.dataset.plotHeight = String(PH / dpr);
    return { ctx, dpr, cssWidth, cssHeight, X0, Y0, PW, PH };
  }
  function message(g, text) {
    g.ctx.fillStyle = '#667085';
    g.ctx.font = '13px system-ui, sans-serif';
    g.ctx.fillText(text, M.left, g.cssHeight / 2);
  }
  function timeAxis(g) {
    const { ctx, dpr, X0, Y0, PW, PH } = g;
    const w = view.b - view.a;
    const step = niceStep(w / 9);
    ctx.strokeStyle = '#98a2b3';
    ctx.fillStyle = '#475467';
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const yb = (Y0 + PH) / dpr;
    ctx.beginPath();
    ctx.moveTo(X0 / dpr, yb + 0.5);
    ctx.lineTo((X0 + PW) / dpr, yb + 0.5);
    for (let t = Math.ceil(view.a / step) * step; t <= view.b; t += step) {
      const x = (X0 + (t - view.a) / w * PW) / dpr;
      ctx.moveTo(x + 0.5, yb);
      ctx.lineTo(x + 0.5, yb + 4);
      ctx.fillText(fmtTime(t), x, yb + 6);
    }
    ctx.stroke();
  }
  function valueAxis(g, max, fmt, step, right) {
    const { ctx, dpr, X0, Y0, PW, PH } = g;
    ctx.strokeStyle = '#e4e7ec';
    ctx.fillStyle = '#475467';
    ctx.textAlign = right ? 'left' : 'right';
    ctx.textBaseline = 'middle';
    ctx.beginPath();
    for (let v = 0; v <= max * 1.0001 && step > 0; v += step) {
      const y = (Y0 + PH - v / max * PH) / dpr;
      if (!right) {
        ctx.moveTo(X0 / dpr, Math.round(y) + 0.5);
        ctx.lineTo((X0 + PW) / dpr, Math.round(y) + 0.5);
      }
      ctx.fillText(fmt(v), right ? (X0 + PW) / dpr + 5 : X0 / dpr - 5, y);
    }
    ctx.stroke();
  }
  function columns(g) {
    const cols = g.PW, dt = (view.b - view.a) / cols;
    const edge = (k) => (k >= cols && view.b >= tr.span ? Infinity : view.a + k * dt);
    return { cols, dt, edge };
  }
  // The coarsest level whose buckets are no wider than a column (else the finest).
  function pickLevel(dt) {
    for (const L of tr.levels) if (tr.span / L.B <= dt) return L;
    return tr.levels[tr.levels.length - 1];
  }
  function bucketRange(L, x0, x1) {
    const bw = tr.span / L.B;
    const k0 = Math.min(L.B - 1, Math.max(0, Math.floor(x0 / bw)));
    const k1 = x1 === Infinity ? L.B - 1 : Math.min(L.B - 1, Math.max(k0, Math.ceil(x1 / bw) - 1));
    return [k0, k1];
  }

  // ---------------------------------------------------------------- (a) active memory timeline
  const timeline = document.getElementById('timeline');
  let timelineState = null;  // what the last draw used, for hover

  function drawTimeline() {
    const g = setup(timeline, 380);
    if (!tr) {
      message(g, 'No trace given (depot-memviz --trace FILE).');
      timeline.dataset.mode = 'none';
      return;
    }
    const { cols, dt, edge } = columns(g);
    const overlapping = lowerBound(tr.start, edge(cols), tr.n) - upperBound(tr.endSorted, view.a, tr.n);
    const img = g.ctx.createImageData(g.PW, g.PH);
    const px = new Uint32Array(img.data.buffer);
    px.fill(0xffffffff);
    const pal = classPalette();
    let yMax = 0;
    if (overlapping <= DETAIL_MAX) {
      // Pass 1: the highest stack over the columns, from prefix sums.
      let ps = 0, pe = 0;
      for (let c = 0; c < cols; c++) {
        ps = lowerBound(tr.start, edge(c + 1), tr.n);
        pe = upperBound(tr.endSorted, edge(c), tr.n);
        yMax = Math.max(yMax, tr.startPS[ps] - tr.endPS[pe]);
      }
      const scale = yMax > 0 ? g.PH / (yMax * 1.04) : 0;
      // Pass 2: every live allocation stacked in allocation order, column by column.
      const live = [];
      let next = lowerBound(tr.start, view.a, tr.n);
      for (let i = 0; i < next; i++) if (tr.endEff[i] > view.a) live.push(i);
      let drawn = live.length;
      const cls = colorBy === 'size' ? tr.sizeClass : tr.streamClass;
      for (let c = 0; c < cols; c++) {
        const x0 = edge(c), x1 = edge(c + 1);
        while (next < tr.n && tr.start[next] < x1) { live.push(next++); drawn++; }
        let w = 0, y = 0;
        for (let k = 0; k < live.length; k++) {
          const i = live[k];
          if (tr.endEff[i] <= x0) continue;
          live[w++] = i;
          const r1 = Math.min(g.PH, Math.round(g.PH - y * scale));
          y += tr.size[i];
          const r0 = Math.max(0, Math.round(g.PH - y * scale));
          const color = pal[cls[i] * SHADES + (i % SHADES)];
          for (let row = r0; row < r1; row++) px[row * g.PW + c] = color;
        }
        live.length = w;
      }
      timeline.dataset.mode = 'bands';
      timeline.dataset.bands = String(drawn);
      timeline.dataset.buckets = '0';
      timelineState = { mode: 'bands', scale, cols, edge };
      document.getElementById('timeline-note').textContent =
        drawn + ' allocations, stacked in allocation order; hover for details';
    } else {
      const L = pickLevel(dt);
      const K1 = tr.K1, K = tr.K, off = colorBy === 'size' ? 0 : K1;
      const nk = colorBy === 'size' ? K1 : tr.K2;
      const pick = new Int32Array(cols);
      const used = new Set();
      for (let c = 0; c < cols; c++) {
        const [k0, k1] = bucketRange(L, edge(c), edge(c + 1));
        let best = k0;
        for (let k = k0 + 1; k <= k1; k++) if (L.totals[k] > L.totals[best]) best = k;
        pick[c] = best;
        used.add(best);
        yMax = Math.max(yMax, L.totals[best]);
      }
      const scale = yMax > 0 ? g.PH / (yMax * 1.04) : 0;
      const present = new Uint8Array(nk);
      for (let c = 0; c < cols; c++) {
        const base = pick[c] * K + off;
        let y = 0;
        for (let k = 0; k < nk; k++) {
          const v = L.stacks[base + k];
          if (v <= 0) continue;
          present[k] = 1;
          const r1 = Math.min(g.PH, Math.round(g.PH - y * scale));
          y += v;
          const r0 = Math.max(0, Math.round(g.PH - y * scale));
          const color = pal[k * SHADES];
          for (let row = r0; row < r1; row++) px[row * g.PW + c] = color;
        }
      }
      timeline.dataset.mode = 'aggregate';
      timeline.dataset.bands = String(present.reduce((s, v) => s + v, 0));
      timeline.dataset.buckets = String(used.size);
      timeline.dataset.level = String(L.B);
      timelineState = { mode: 'aggregate', scale, cols, edge, L, pick, off, nk };
      document.getElementById('timeline-note').textContent =
        overlapping + ' allocations in view: live bytes per ' + (colorBy === 'size' ? 'size class' : 'stream') +
        ' at each of ' + L.B + ' time buckets\u2019 peak; zoom in for single allocations';
    }
    timeline.dataset.columns = String(cols);
    timeline.dataset.ymax = String(yMax);
    g.ctx.putImageData(img, g.X0, g.Y0);
    valueAxis(g, yMax * 1.04 || 1, fmtBytes, niceByteStep((yMax * 1.04 || 1) / 5), false);
    timeAxis(g);
    // out-of-memory markers
    const w = view.b - view.a;
    g.ctx.fillStyle = '#d92d20';
    let marks = 0;
    for (const [t] of T.ooms) {
      if (t < view.a || t > view.b) continue;
      const x = (g.X0 + (t - view.a) / w * g.PW) / g.dpr;
      g.ctx.beginPath();
      g.ctx.moveTo(x - 5, g.Y0 / g.dpr);
      g.ctx.lineTo(x + 5, g.Y0 / g.dpr);
      g.ctx.lineTo(x, g.Y0 / g.dpr + 8);
      g.ctx.fill();
      marks++;
    }
    timeline.dataset.ooms = String(marks);
    drawLegend();
  }

  function drawLegend() {
    const box = document.getElementById('legend');
    box.textContent = '';
    if (!tr) return;
    classNames().forEach((name, c) => {
      const item = document.createElement('span');
      const sw = document.createElement('i');
      sw.style.background = PALETTE[c % PALETTE.length];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(name));
      box.appendChild(item);
    });
    if (T.ooms.length) {
      const item = document.createElement('span');
      item.innerHTML = '<i style="background:#d92d20"></i>out of memory (' + T.out_of_memory + ')';
      box.appendChild(item);
    }
  }

  function timelineHover(ev) {
    if (!tr || !timelineState) return null;
    const rect = timeline.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const X0 = Math.round(M.left * dpr), Y0 = Math.round(M.top * dpr);
    const c = Math.floor((ev.clientX - rect.left) * dpr) - X0;
    const rowY = (ev.clientY - rect.top) * dpr - Y0;
    const PH = timeline.height - Y0 - Math.round(M.bottom * dpr);
    if (c < 0 || c >= timelineState.cols || rowY < 0 || rowY > PH) return null;
    const value = (PH - rowY) / timelineState.scale;
    const x0 = timelineState.edge(c), x1 = timelineState.edge(c + 1);
    if (timelineState.mode === 'bands') {
      const hi = lowerBound(tr.start, x1, tr.n);
      let y = 0;
      for (let i = 0; i < hi; i++) {
        if (tr.endEff[i] <= x0) continue;
        y += tr.size[i];
        if (y >= value) return allocationText(i);
      }
      return null;
    }
    const L = timelineState.L, k = timelineState.pick[c];
    const bw = tr.span / L.B;
    const lines = ['time ' + fmtTime(k * bw) + ' \u2013 ' + fmtTime((k + 1) * bw) + ' (bucket ' + k + ' of ' + L.B + ')',
                   'live at the bucket\u2019s peak: ' + fmtBytes(L.totals[k])];
    const names = classNames();
    for (let j = 0; j < timelineState.nk; j++) {
      const v = L.stacks[k * tr.K + timelineState.off + j];
      if (v > 0) lines.push('  ' + names[j] + ': ' + fmtBytes(v));
    }
    lines.push('zoom in to see single allocations');
    return lines.join('\n');
  }

  function allocationText(i) {
    const f = tr.flags[i];
    const lines = ['address ' + hex(tr.addr[i]),
                   'size ' + fmtBytes(tr.size[i]) + ' (' + tr.size[i] + ' B), requested ' + tr.req[i] + ' B'];
    const from = f & 1 ? 'before the trace began' : fmtTime(tr.start[i]);
    const to = f & 2 ? 'still alive at the end of the trace' : fmtTime(tr.end[i]);
    lines.push('allocated ' + from + ', freed ' + to);
    lines.push('lifetime ' + (f & 3 ? 'at least ' : '') + fmtTime(tr.end[i] - tr.start[i]) +
               (f & 8 ? ' (address reused without a recorded free)' : ''));
    lines.push('stream ' + T.streams[tr.stream[i]] + ', thread ' + T.threads[tr.thread[i]]);
    if (!(f & 1)) lines.push(f & 4 ? 'served from the cache' : 'cache miss');
    lines.push('allocation #' + i + ' (' + classNames()[colorBy === 'size' ? tr.sizeClass[i] : tr.streamClass[i]] + ')');
    return lines.join('\n');
  }

  // ---------------------------------------------------------------- (b) series
  const seriesCanvas = document.getElementById('series');
  let seriesState = null;
  const SERIES = [{ name: 'reserved', color: '#98a2b3', fill: 'rgba(152,162,179,0.35)' },
                  { name: 'allocated', color: '#2f6fb5', fill: 'rgba(47,111,181,0.30)' },
                  { name: 'fragmentation', color: '#d92d20', fill: 'rgba(217,45,32,0.22)' }];

  function drawSeries() {
    const g = setup(seriesCanvas, 220);
    if (!tr) {
      message(g, 'No trace given.');
      seriesCanvas.dataset.points = '0';
      return;
    }
    const { cols, dt, edge } = columns(g);
    const L = pickLevel(dt);
    const idx = T.has_segments ? [1, 0, 2] : [0];  // series index in the data: 0 allocated, 1 reserved, 2 frag
    const lo = [new Float64Array(cols), new Float64Array(cols), new Float64Array(cols)];
    const hi = [new Float64Array(cols), new Float64Array(cols), new Float64Array(cols)];
    const last = [new Float64Array(cols), new Float64Array(cols), new Float64Array(cols)];
    let yMax = 0;
    for (let c = 0; c < cols; c++) {
      const [k0, k1] = bucketRange(L, edge(c), edge(c + 1));
      for (let s = 0; s < 3; s++) {
        let l = Infinity, h = -Infinity;
        for (let k = k0; k <= k1; k++) {
          l = Math.min(l, L.series[k * 9 + s * 3]);
          h = Math.max(h, L.series[k * 9 + s * 3 + 1]);
        }
        lo[s][c] = l;
        hi[s][c] = h;
        last[s][c] = L.series[k1 * 9 + s * 3 + 2];
      }
      yMax = Math.max(yMax, hi[0][c], T.has_segments ? hi[1][c] : 0);
    }
    const top = yMax * 1.05 || 1;
    valueAxis(g, top, fmtBytes, niceByteStep(top / 5), false);
    if (T.has_segments) valueAxis(g, 1, (v) => Math.round(v * 100) + '%', 0.25, true);
    const { ctx, dpr, X0, Y0, PW, PH } = g;
    const yOf = (s, v) => (Y0 + PH - (s === 2 ? v / 10000 : v / top) * PH) / dpr;
    ctx.save();
    ctx.beginPath();
    ctx.rect(X0 / dpr, Y0 / dpr, PW / dpr, PH / dpr);
    ctx.clip();
    for (const s of idx) {
      const style = SERIES[s === 0 ? 1 : s === 1 ? 0 : 2];
      ctx.fillStyle = style.fill;
      for (let c = 0; c < cols; c++) {
        const y0 = yOf(s, hi[s][c]), y1 = yOf(s, lo[s][c]);
        ctx.fillRect((X0 + c) / dpr, y0, 1 / dpr, Math.max(y1 - y0, 1 / dpr));
      }
      ctx.strokeStyle = style.color;
      ctx.lineWidth = 1.25;
      ctx.beginPath();
      for (let c = 0; c < cols; c++) {
        const x = (X0 + c + 0.5) / dpr, y = yOf(s, last[s][c]);
        if (c === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      }
      ctx.stroke();
    }
    ctx.restore();
    timeAxis(g);
    seriesState = { cols, edge, L, lo, hi, last };
    seriesCanvas.dataset.points = String(cols * idx.length);
    seriesCanvas.dataset.series = idx.map((s) => ['allocated', 'reserved', 'fragmentation'][s]).join(',');
    seriesCanvas.dataset.level = String(L.B);
    seriesCanvas.dataset.ymax = String(yMax);
    document.getElementById('series-note').textContent = T.has_segments
      ? 'left axis bytes; right axis fragmentation = 1 \u2212 largest free range / free bytes in the segments; lines: value at the end of each pixel, bands: its range'
      : 'this trace has no segment events (an RMM log?): only allocated bytes are known';
    const box = document.getElementById('series-legend');
    box.textContent = '';
    for (const s of idx) {
      const style = SERIES[s === 0 ? 1 : s === 1 ? 0 : 2];
      const item = document.createElement('span');
      item.innerHTML = '<i style="background:' + style.color + '"></i>' + style.name;
      box.appendChild(item);
    }
  }

  function seriesHover(ev) {
    if (!seriesState) return null;
    const rect = seriesCanvas.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const c = Math.floor((ev.clientX - rect.left) * dpr) - Math.round(M.left * dpr);
    if (c < 0 || c >= seriesState.cols) return null;
    const x0 = seriesState.edge(c), x1 = seriesState.edge(c + 1);
    const st = seriesState;
    const lines = ['time ' + fmtTime(x0) + ' \u2013 ' + fmtTime(x1 === Infinity ? tr.span : x1)];
    lines.push('allocated ' + fmtBytes(st.last[0][c]) + ' (range ' + fmtBytes(st.lo[0][c]) + ' \u2013 ' + fmtBytes(st.hi[0][c]) + ')');
    if (T.has_segments) {
      lines.push('reserved ' + fmtBytes(st.last[1][c]) + ' (range ' + fmtBytes(st.lo[1][c]) + ' \u2013 ' + fmtBytes(st.hi[1][c]) + ')');
      lines.push('fragmentation ' + (st.last[2][c] / 100).toFixed(2) + '% (range ' + (st.lo[2][c] / 100).toFixed(2) +
                 ' \u2013 ' + (st.hi[2][c] / 100).toFixed(2) + '%)');
    }
    return lines.join('\n');
  }

  // ---------------------------------------------------------------- (c) segment map
  const segCanvas = document.getElementById('segmap');
  const SEG = { row: 18, label: 200, maxRows: 1500 };
  function drawSegments() {
    const rows = segs ? Math.min(segs.length, SEG.maxRows) : 0;
    const g = setup(segCanvas, segs && rows ? rows * SEG.row + 8 : 60);
    if (!segs) {
      message(g, 'No snapshot given (depot-memviz --snapshot FILE).');
      segCanvas.dataset.segments = '0';
      segCanvas.dataset.blocks = '0';
      return;
    }
    if (!rows) message(g, 'The snapshot holds no segments.');
    const { ctx } = g;
    const barX = SEG.label, barW = g.cssWidth - SEG.label - 12;
    let blocks = 0;
    const counts = [0, 0, 0, 0, 0];
    ctx.textBaseline = 'middle';
    for (let r = 0; r < rows; r++) {
      const s = segs[r];
      const y = 4 + r * SEG.row;
      ctx.fillStyle = '#475467';
      ctx.textAlign = 'right';
      ctx.fillText(hex(s.addr) + '  ' + fmtBytes(s.size) + (s.small ? ' small' : ' large'), barX - 8, y + SEG.row / 2);
      ctx.fillStyle = '#f2f4f7';
      ctx.fillRect(barX, y + 2, barW, SEG.row - 4);
      for (const b of s.blocks) {
        const x0 = barX + b.off / s.span * barW;
        const w = Math.max(b.size / s.span * barW, 1);
        ctx.fillStyle = STATE_COLORS[b.state] || '#000';
        ctx.fillRect(x0, y + 2, w, SEG.row - 4);
        if (w >= 4) {
          ctx.fillStyle = '#ffffff';
          ctx.fillRect(x0, y + 2, 1, SEG.row - 4);
        }
        blocks++;
        counts[b.state] = (counts[b.state] || 0) + 1;
      }
    }
    segCanvas.dataset.segments = String(rows);
    segCanvas.dataset.blocks = String(blocks);
    segCanvas.dataset.allocated = String(counts[0]);
    segCanvas.dataset.pending = String(counts[1]);
    segCanvas.dataset.free = String(counts[2]);
    segCanvas.dataset.unmapped = String(counts[3]);
    segCanvas.dataset.kept = String(counts[4]);
    document.getElementById('segments-note').textContent =
      S.device + ': ' + S.segments + ' segments, ' + S.blocks + ' blocks, reserved ' + fmtBytes(S.reserved) +
      ', allocated ' + fmtBytes(S.allocated) + (S.pending_free ? ', pending free ' + fmtBytes(S.pending_free) : '') +
      (S.kept ? ', free kept for reuse ' + fmtBytes(S.kept) : '') +
      (segs.length > rows ? ' (first ' + rows + ' segments shown)' : '') + '; each row is one segment, full width';
    const box = document.getElementById('segments-legend');
    box.textContent = '';
    STATE_NAMES.forEach((name, k) => {
      const item = document.createElement('span');
      item.innerHTML = '<i style="background:' + STATE_COLORS[k] + '"></i>' + name;
      box.appendChild(item);
    });
  }
  function segmentHover(ev) {
    if (!segs) return null;
    const rect = segCanvas.getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const r = Math.floor((y - 4) / SEG.row);
    if (r < 0 || r >= Math.min(segs.length, SEG.maxRows)) return null;
    const s = segs[r];
    const lines = ['segment ' + hex(s.addr) + ', ' + fmtBytes(s.size) + ' (' + (s.small ? 'small' : 'large') +
                   ' pool), stream ' + S.streams[s.stream] + ', ' + s.blocks.length + ' blocks'];
    const barW = rect.width - SEG.label - 12;
    const off = (x - SEG.label) / barW * s.span;
    if (off >= 0 && off <= s.span) {
      for (const b of s.blocks) {
        if (off >= b.off && off < b.off + b.size) {
          lines.push('block ' + hex(b.addr) + ': ' + STATE_NAMES[b.state] + ', ' + fmtBytes(b.size) + ' (' + b.size +
                     ' B)' + (b.state < 2 ? ', requested ' + b.req + ' B' : ''));
          break;
        }
      }
    }
    return lines.join('\n');
  }

  // ---------------------------------------------------------------- header, interaction
  function drawHeader() {
    document.getElementById('title').textContent = D.title || '';
    const parts = [];
    const sum = document.getElementById('summary');
    if (T) {
      parts.push(T.format + (T.device ? ' on ' + T.device : ''), T.events + ' events', T.allocations + ' allocations',
                 'span ' + fmtTime(T.span_ns), 'peak allocated ' + fmtBytes(T.peak_allocated));
      if (T.has_segments) {
        parts.push('peak reserved ' + fmtBytes(T.peak_reserved),
                   'peak fragmentation ' + (T.peak_fragmentation * 100).toFixed(1) + '%');
      }
      if (T.out_of_memory) parts.push(T.out_of_memory + ' out-of-memory');
      if (T.segment_moves) parts.push(T.segment_moves + ' segments moved between streams');
      if (T.before_trace) parts.push(T.before_trace + ' blocks allocated before the trace began');
      sum.dataset.events = String(T.events);
      sum.dataset.allocations = String(T.allocations);
      sum.dataset.peakAllocated = String(T.peak_allocated);
      sum.dataset.peakReserved = String(T.peak_reserved);
      sum.dataset.finalFragmentation = String(T.final_fragmentation);
      sum.dataset.segmentMoves = String(T.segment_moves || 0);
    }
    if (S) parts.push('snapshot ' + S.file + ': ' + S.segments + ' segments');
    sum.textContent = parts.join(' \u00b7 ');
    document.getElementById('footer').textContent =
      (D.generator || 'depot-memviz') + '. Wheel or the buttons zoom the time axis, drag pans, double-click shows the whole trace.';
  }
  function drawWindow() {
    const box = document.getElementById('window');
    box.textContent = tr
      ? 'showing ' + fmtTime(view.a) + ' \u2013 ' + fmtTime(view.b) + ' of ' + fmtTime(tr.span) : '';
    // The exact visible time range (ns since the trace began), for tests/memviz/interact.py.
    if (tr) {
      box.dataset.viewStart = String(view.a);
      box.dataset.viewEnd = String(view.b);
      box.dataset.span = String(tr.span);
    }
  }

  let draws = 0;
  function drawAll() {
    pending = false;
    const t0 = performance.now();
    if (tr) clampView();
    drawTimeline();
    drawSeries();
    drawWindow();
    // The mouse did not move but what is under it did (wheel zoom, a button, a resize): the
    // tooltip is worked out again for where the mouse is, else it would keep describing what
    // was there before the redraw.
    if (hoverAt && !drag) showTip(hoverAt, hoverAt.hover(hoverAt));
    draws++;
    root.dataset.drawMs = String(Math.round(performance.now() - t0));
    root.dataset.draws = String(draws);
  }
  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(drawAll);
  }

  function zoomAt(t, factor) {
    if (!tr) return;
    const w = view.b - view.a;
    const nw = Math.min(Math.max(w * factor, minWidth), tr.span);
    const f = (t - view.a) / w;
    view.a = t - f * nw;
    view.b = view.a + nw;
    clampView();  // now, not at the redraw: a second wheel event before it must see this view
    schedule();
  }
  function timeAtEvent(canvas, ev) {
    const rect = canvas.getBoundingClientRect();
    const plotW = rect.width - M.left - M.right;
    const f = Math.min(Math.max((ev.clientX - rect.left - M.left) / plotW, 0), 1);
    return view.a + f * (view.b - view.a);
  }
  const tip = document.getElementById('tip');
  function showTip(ev, text) {
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text;
    tip.hidden = false;
    // Below right of the mouse, or on its other side where there is no room (not over it).
    // The room is the root's client box: window.innerWidth/innerHeight include the
    // scrollbars, and a tooltip kept inside those went partly under the page's scrollbar.
    const w = tip.offsetWidth, h = tip.offsetHeight, W = root.clientWidth, H = root.clientHeight;
    let x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w + 8 > W) x = ev.clientX - 14 - w;
    if (y + h + 8 > H) y = ev.clientY - 14 - h;
    tip.style.left = Math.max(0, Math.min(x, W - w - 8)) + 'px';
    tip.style.top = Math.max(0, Math.min(y, H - h - 8)) + 'px';
  }
  let drag = null;
  let hoverAt = null;  // the last mouse position over a plot and its hover function; null when off
  for (const [canvas, hover] of [[timeline, timelineHover], [seriesCanvas, seriesHover]]) {
    canvas.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      // deltaY is in pixels in Chromium; Firefox gives a mouse wheel's notches in lines
      // (deltaMode 1, deltaY 3), which would hardly zoom at all: lines and pages to pixels.
      const dy = ev.deltaY * (ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? window.innerHeight : 1);
      zoomAt(timeAtEvent(canvas, ev), Math.exp(dy * 0.002));
    }, { passive: false });
    canvas.addEventListener('pointerdown', (ev) => {
      if (!tr || ev.button !== 0) return;  // the left button (or a touch) drags
      drag = { x: ev.clientX, a: view.a, b: view.b, canvas };
      canvas.setPointerCapture(ev.pointerId);
    });
    canvas.addEventListener('pointermove', (ev) => {
      if (drag && drag.canvas === canvas) {
        const plotW = canvas.getBoundingClientRect().width - M.left - M.right;
        const shift = -(ev.clientX - drag.x) / plotW * (drag.b - drag.a);
        view.a = drag.a + shift;
        view.b = drag.b + shift;
        clampView();
        tip.hidden = true;
        schedule();
        return;
      }
      hoverAt = { clientX: ev.clientX, clientY: ev.clientY, hover };
      showTip(ev, hover(ev));
    });
    canvas.addEventListener('pointerup', () => { drag = null; });
    canvas.addEventListener('pointercancel', () => { drag = null; });  // else a cancelled drag never ends
    canvas.addEventListener('pointerleave', () => { hoverAt = null; tip.hidden = true; });
    canvas.addEventListener('dblclick', () => { if (tr) { view.a = 0; view.b = tr.span; schedule(); } });
  }
  segCanvas.addEventListener('pointermove', (ev) => showTip(ev, segmentHover(ev)));
  segCanvas.addEventListener('pointerleave', () => { tip.hidden = true; });
  document.getElementById('zoom-in').addEventListener('click', () => zoomAt((view.a + view.b) / 2, 0.5));
  document.getElementById('zoom-out').addEventListener('click', () => zoomAt((view.a + view.b) / 2, 2));
  document.getElementById('zoom-reset').addEventListener('click', () => {
    if (tr) { view.a = 0; view.b = tr.span; schedule(); }
  });
  const bySize = document.getElementById('by-size'), byStream = document.getElementById('by-stream');
  function setColor(mode) {
    colorBy = mode;
    bySize.classList.toggle('on', mode === 'size');
    byStream.classList.toggle('on', mode === 'stream');
    schedule();
  }
  bySize.addEventListener('click', () => setColor('size'));
  byStream.addEventListener('click', () => setColor('stream'));
  bySize.classList.toggle('on', colorBy === 'size');
  byStream.classList.toggle('on', colorBy === 'stream');
  window.addEventListener('resize', () => { schedule(); drawSegments(); });
  // A canvas takes its box's width when drawn, and that width also changes without a window
  // resize: the page's scrollbar comes or goes when the segment map (drawn after the plots)
  // or the error box changes the page's height. CSS then stretches the old drawing, and hover
  // and zoom miss what is drawn by up to the scrollbar's width. Redraw what no longer fits.
  const wantWidth = (c) => Math.round(Math.max(c.parentElement.clientWidth, 320) * (window.devicePixelRatio || 1));
  const plotsStale = () => wantWidth(timeline) !== timeline.width || wantWidth(seriesCanvas) !== seriesCanvas.width;
  const segmentsStale = () => wantWidth(segCanvas) !== segCanvas.width;
  if (typeof ResizeObserver === 'function') {
    new ResizeObserver(() => {
      if (plotsStale()) schedule();
      if (segmentsStale()) drawSegments();
    }).observe(document.body);
  }

  // The first drawing settles before the page says it is ready: drawing the segment map can
  // take the scrollbar away (or bring it), and the observer's redraw would come a frame later,
  // after a screenshot or a test had already read the page. Reading clientWidth lays the page
  // out at once, so each pass sees the widths the last one left; two passes settle it (a third
  // guards a page whose scrollbar depends on its own width).
  drawHeader();
  drawAll();
  drawSegments();
  for (let pass = 0; pass < 3 && (plotsStale() || segmentsStale()); pass++) {
    if (plotsStale()) drawAll();
    if (segmentsStale()) drawSegments();
  }
  root.dataset.ready = '1';
})();

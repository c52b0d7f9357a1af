#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The memviz interaction test: drives headless Chromium through the Chrome DevTools Protocol
# (--remote-debugging-pipe: JSON commands ending in '\0' on the child's fd 3, answers on fd 4)
# with real input events on depot-memviz pages of real pool traces, and checks
#   hover: the tooltip over a drawn band names the allocation that really is there (worked
#          out here from the trace file, not asked of the page; the screenshot pixel under
#          the mouse has that allocation's colour), the series tooltip's reserved and
#          allocated bytes match the trace, and leaving the canvas hides the tooltip;
#   zoom:  the wheel zooms by exp(deltaY * 0.002) around the time under the mouse, zooming
#          far in draws single allocations (as many as overlap the view, counted here), drag
#          pans by the distance dragged, double-click and the buttons work;
# and that these checks reject deliberately broken pages (no wheel listener; a tooltip that
# names the wrong allocation). Any script or console error fails. Chromium missing fails.
# Python standard library only.
#
# interact.py --memviz BIN --make-trace BIN --workdir DIR
import argparse
import base64
import bisect
import decimal
import fcntl
import json
import math
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib

TOTAL_TIMEOUT = 900  # seconds for the whole test (a watchdog: it never hangs)
STEP_TIMEOUT = 30    # seconds for one DevTools command
LOAD_TIMEOUT = 90    # seconds for a page to load and draw
DRAW_TIMEOUT = 10    # seconds for the redraw after an input event

CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--disable-dev-shm-usage', '--window-size=1400,900', '--remote-debugging-pipe']


class Checker:
    """Prints 'ok    ...' / 'FAIL  ...' lines (quiet: only collects, for the negative controls)."""

    def __init__(self, quiet=False):
        self.quiet = quiet
        self.failures = []

    def __call__(self, cond, what):
        cond = bool(cond)
        if not self.quiet:
            print(('ok    ' if cond else 'FAIL  ') + what, flush=True)
        if not cond:
            self.failures.append(what)
        return cond


def find_chromium():
    for name in (os.environ.get('DEPOT_CHROMIUM', ''), 'chromium', 'chromium-browser'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------ DevTools over a pipe
class CdpError(Exception):
    pass


class Browser:
    def __init__(self, chromium, log_path):
        self.profile = tempfile.mkdtemp(prefix='memviz-interact-')

        def high(fd):  # above 10, so the dup2 onto 3 and 4 in the child cannot clobber them
            n = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(fd)
            return n
        cmd_r, cmd_w = (high(fd) for fd in os.pipe())  # we write, Chromium reads (its fd 3)
        res_r, res_w = (high(fd) for fd in os.pipe())  # Chromium writes (its fd 4), we read

        def child_fds():
            os.dup2(cmd_r, 3)  # os.dup2 makes 3 and 4 inheritable; everything else is close-on-exec
            os.dup2(res_w, 4)

        self.log = open(log_path, 'wb')
        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, '--user-data-dir=' + self.profile, 'about:blank'],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(res_w)
        self.wfd, self.rfd = cmd_w, res_r
        self.inbox = queue.Queue()
        self.next_id = 0
        self.session = None
        self.problems = []  # script errors, console errors, error log entries of the open page
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buf = b''
        while True:
            try:
                chunk = os.read(self.rfd, 1 << 20)
            except OSError:
                chunk = b''
            if not chunk:
                self.inbox.put(None)
                return
            buf += chunk
            while b'\0' in buf:
                msg, buf = buf.split(b'\0', 1)
                try:
                    self.inbox.put(json.loads(msg))
                except ValueError:
                    self.inbox.put({'method': '(bad json)', 'params': {'text': msg[:200].decode(errors='replace')}})

    def _event(self, msg):
        method, p = msg.get('method'), msg.get('params', {})
        if method == 'Runtime.exceptionThrown':
            d = p.get('exceptionDetails', {})
            self.problems.append('exception: ' + d.get('text', '') + ' ' + d.get('exception', {}).get('description', ''))
        elif method == 'Runtime.consoleAPICalled' and p.get('type') == 'error':
            self.problems.append('console.error: ' + ' '.join(str(a.get('value', a.get('description', ''))) for a in p.get('args', [])))
        elif method == 'Log.entryAdded' and p.get('entry', {}).get('level') == 'error':
            self.problems.append('log error: ' + p['entry'].get('text', ''))
        elif method == 'Inspector.detached' or method == 'Target.detachedFromTarget':
            self.problems.append('DevTools session detached: ' + json.dumps(p)[:200])
        elif method == '(bad json)':
            self.problems.append('unreadable DevTools message: ' + p['text'])

    def _wait(self, want_id, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError('no answer within %g s' % timeout)
            try:
                msg = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                self.inbox.put(None)
                raise CdpError('Chromium closed the DevTools pipe (exit code %r)' % self.proc.poll())
            if want_id is not None and msg.get('id') == want_id:
                if 'error' in msg:
                    raise CdpError(json.dumps(msg['error']))
                return msg.get('result', {})
            if 'method' in msg:
                self._event(msg)

    def call(self, method, params=None, session=True, timeout=STEP_TIMEOUT):
        self.next_id += 1
        msg = {'id': self.next_id, 'method': method, 'params': params or {}}
        if session and self.session:
            msg['sessionId'] = self.session
        data = json.dumps(msg).encode() + b'\0'
        while data:
            data = data[os.write(self.wfd, data):]
        return self._wait(self.next_id, timeout)

    def pump(self, seconds):
        """Handles the events that arrive within `seconds`."""
        try:
            self._wait(None, seconds)
        except CdpError as e:
            if 'closed' in str(e):
                raise

    def start(self):
        target = self.call('Target.createTarget', {'url': 'about:blank'}, session=False)['targetId']
        self.session = self.call('Target.attachToTarget', {'targetId': target, 'flatten': True}, session=False)['sessionId']
        for domain in ('Page', 'Runtime', 'Log'):
            self.call(domain + '.enable')
        return self.call('Browser.getVersion', session=False).get('product', '?')

    def evaluate(self, expr):
        r = self.call('Runtime.evaluate', {'expression': expr, 'returnByValue': True})
        if 'exceptionDetails' in r:
            raise CdpError('evaluate failed: %s: %s' % (expr[:80], r['exceptionDetails'].get('exception', {}).get('description', r['exceptionDetails'].get('text'))))
        return r.get('result', {}).get('value')

    def wait_for(self, expr, timeout):
        """Polls a JavaScript expression until it is truthy; returns its last value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.evaluate(expr)
            if v or time.monotonic() > deadline:
                return v
            self.pump(0.05)

    def open(self, path):
        self.problems = []
        self.call('Page.navigate', {'url': 'file://' + os.path.abspath(path)})
        return self.wait_for("document.readyState === 'complete' && document.documentElement.dataset.ready === '1'", LOAD_TIMEOUT)

    def mouse(self, kind, x, y, **kw):
        self.call('Input.dispatchMouseEvent', {'type': kind, 'x': x, 'y': y, **kw})

    def click(self, x, y, count=1):
        for c in range(1, count + 1):
            self.mouse('mousePressed', x, y, button='left', buttons=1, clickCount=c)
            self.mouse('mouseReleased', x, y, button='left', buttons=0, clickCount=c)

    def screenshot(self, clip=None):
        params = {'format': 'png'}
        if clip:
            params['clip'] = {**clip, 'scale': 1}
        return base64.b64decode(self.call('Page.captureScreenshot', params, timeout=60)['data'])

    def close(self):
        try:
            self.call('Browser.close', session=False, timeout=10)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.wfd, self.rfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# ------------------------------------------------------------------ PNG (stdlib decoder)
def png_decode(data):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB/RGBA non-interlaced PNG."""
    if data[:8] != b'\x89PNG\r\n\x1a\n':
        raise ValueError('not a PNG')
    pos, idat, w = 8, b'', 0
    while pos < len(data):
        n, kind = struct.unpack('>I4s', data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack('>I', data[pos + 8 + n:pos + 12 + n])[0]:
            raise ValueError('bad CRC in ' + kind.decode())
        if kind == b'IHDR':
            w, h, depth, ctype, _, _, interlace = struct.unpack('>IIBBBBB', body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError('unsupported PNG (depth %d, colour type %d)' % (depth, ctype))
            bpp = 3 if ctype == 2 else 4
        elif kind == b'IDAT':
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


# ------------------------------------------------------------------ the trace, independently of the page
def js_round(x):
    return math.floor(x + 0.5)


def to_fixed(v, digits):
    """JavaScript's Number.prototype.toFixed (ties away from zero on the exact binary value)."""
    q = decimal.Decimal(1).scaleb(-digits)
    return str(decimal.Decimal(v).quantize(q, rounding=decimal.ROUND_HALF_UP))


def fmt_time(ns):
    a = abs(ns)

    def f(v, unit):
        return to_fixed(v, 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2) + ' ' + unit
    if a < 1e3:
        return f(ns, 'ns')
    if a < 1e6:
        return f(ns / 1e3, '\u00b5s')
    if a < 1e9:
        return f(ns / 1e6, 'ms')
    return f(ns / 1e9, 's')


UNITS = {'B': 1, 'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30, 'TiB': 1 << 40, 'PiB': 1 << 50}


def bytes_match(text, expected):
    """Does a page-formatted byte count ('52.3 MiB') stand for `expected` bytes, within its rounding?"""
    m = re.fullmatch(r'(-?[0-9.]+) (B|[KMGTP]iB)', text.strip())
    if not m:
        return False
    digits = len(m.group(1).split('.')[1]) if '.' in m.group(1) else 0
    unit = UNITS[m.group(2)]
    return abs(float(m.group(1)) * unit - expected) <= 0.5 * 10 ** -digits * unit * 1.0001 + 0.5


class TraceModel:
    """What a depot.trace.v1 file says: allocations (as depot-memviz orders them), the
    allocated / reserved series per time bucket; the page's drawing rules redone here."""
    SIZE_LIMITS = [4096, 65536, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
    PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
               '#9c755f', '#bab0ac']

    def __init__(self, path):
        ev = json.load(open(path))['events']
        times, now = [], ev[0]['time_ns']
        t_begin = now
        for e in ev:
            now = max(now, e['time_ns'])
            times.append(now - t_begin)
        span = times[-1]
        self.span = float(max(span, 1))
        regular, before, live = [], [], {}
        replaced_at, event_alloc = {}, {}
        base_reserved, segs = 0, set()
        for k, (e, t) in enumerate(zip(ev, times)):
            kind, addr = e['kind'], e.get('address', 0)
            rec = dict(address=addr, size=e.get('size', 0), requested=e.get('requested', 0),
                       stream=e.get('stream', 0), thread=e.get('thread', 0))
            if kind == 'alloc':
                if addr in live:
                    j = live.pop(addr)
                    regular[j]['end'] = t
                    regular[j]['flags'] |= 8
                    replaced_at[k] = ('r', j)
                regular.append(dict(rec, start=t, end=span, flags=4 if e.get('cache_hit') else 0))
                live[addr] = len(regular) - 1
                event_alloc[k] = ('r', len(regular) - 1)
            elif kind == 'free':
                if addr in live:
                    j = live.pop(addr)
                    regular[j]['end'] = t
                    event_alloc[k] = ('r', j)
                else:
                    before.append(dict(rec, start=0, end=t, flags=1))
                    event_alloc[k] = ('b', len(before) - 1)
            elif kind == 'segment_alloc':
                segs.add(addr)
            elif kind == 'segment_free':
                if addr in segs:
                    segs.discard(addr)
                else:
                    base_reserved += e['size']
        for j in live.values():
            regular[j]['flags'] |= 2
        self.allocs = before + regular
        index = lambda ref: ref[1] if ref[0] == 'b' else len(before) + ref[1]  # noqa: E731
        for a in self.allocs:
            a['end_eff'] = float(a['end']) if a['end'] > a['start'] else a['start'] + 0.5
        self.starts = [float(a['start']) for a in self.allocs]
        self.start_ps = [0]
        for a in self.allocs:
            self.start_ps.append(self.start_ps[-1] + a['size'])
        order = sorted(range(len(self.allocs)), key=lambda i: self.allocs[i]['end_eff'])
        self.end_sorted = [self.allocs[i]['end_eff'] for i in order]
        self.end_ps = [0]
        for i in order:
            self.end_ps.append(self.end_ps[-1] + self.allocs[i]['size'])

        # series: [allocated, reserved] lo / hi / last per finest bucket, then coarser levels
        finest = 1024
        while finest < 65536 and finest < len(ev):
            finest *= 4
        allocated, reserved = sum(a['size'] for a in before), base_reserved
        lo, hi, last = [], [], []

        def open_bucket():
            v = (allocated, reserved)
            lo.append(list(v))
            hi.append(list(v))
            last.append(list(v))
        open_bucket()
        for k, (e, t) in enumerate(zip(ev, times)):
            b = min(finest - 1, t * finest // max(span, 1))
            while len(lo) - 1 < b:
                open_bucket()
            kind = e['kind']
            if kind == 'alloc':
                if k in replaced_at:
                    allocated -= min(allocated, self.allocs[index(replaced_at[k])]['size'])
                allocated += self.allocs[index(event_alloc[k])]['size']
            elif kind == 'free':
                allocated -= min(allocated, self.allocs[index(event_alloc[k])]['size'])
            elif kind == 'segment_alloc':
                reserved += e['size']
            elif kind == 'segment_free':
                reserved -= min(reserved, e['size'])
            for s, v in enumerate((allocated, reserved)):
                lo[-1][s] = min(lo[-1][s], v)
                hi[-1][s] = max(hi[-1][s], v)
                last[-1][s] = v
        while len(lo) < finest:
            open_bucket()
        self.levels = []  # coarse to fine: (buckets, lo, hi, last)
        n = 1024
        while n <= finest:
            f = finest // n
            self.levels.append((n, [[min(lo[c][s] for c in range(b * f, (b + 1) * f)) for s in (0, 1)] for b in range(n)],
                                [[max(hi[c][s] for c in range(b * f, (b + 1) * f)) for s in (0, 1)] for b in range(n)],
                                [last[(b + 1) * f - 1] for b in range(n)]))
            n *= 4

    # The page's column edges (page.js columns()) for a view and a plot width in pixels.
    def edge(self, view, cols, k):
        a, b = view
        return math.inf if k >= cols and b >= self.span else a + k * ((b - a) / cols)

    def overlapping(self, view, cols):
        return (bisect.bisect_left(self.starts, self.edge(view, cols, cols))
                - bisect.bisect_right(self.end_sorted, view[0]))

    def ymax(self, view, cols):
        y = 0
        for c in range(cols):
            ps = bisect.bisect_left(self.starts, self.edge(view, cols, c + 1))
            pe = bisect.bisect_right(self.end_sorted, self.edge(view, cols, c))
            y = max(y, self.start_ps[ps] - self.end_ps[pe])
        return y

    def column_bands(self, view, cols, c, ph, scale):
        """[(allocation index, first row, end row)] drawn in column c, bottom first."""
        x0, x1 = self.edge(view, cols, c), self.edge(view, cols, c + 1)
        out, y = [], 0
        for i in range(bisect.bisect_left(self.starts, x1)):
            a = self.allocs[i]
            if a['end_eff'] <= x0:
                continue
            r1 = min(ph, js_round(ph - y * scale))
            y += a['size']
            r0 = max(0, js_round(ph - y * scale))
            out.append((i, r0, r1))
        return out

    def colour(self, i):
        size = self.allocs[i]['size']
        c = 0
        while c < len(self.SIZE_LIMITS) and size > self.SIZE_LIMITS[c]:
            c += 1
        base = int(self.PALETTE[c % len(self.PALETTE)][1:], 16)
        t = (i % 4) / 5
        return tuple(js_round(x + (255 - x) * t * 0.9) for x in ((base >> 16) & 255, (base >> 8) & 255, base & 255))

    def series_at(self, view, cols, c):
        """(lo, hi, last) of [allocated, reserved] for column c, as the page's level pick does."""
        x0, x1 = self.edge(view, cols, c), self.edge(view, cols, c + 1)
        dt = (view[1] - view[0]) / cols
        level = next((L for L in self.levels if self.span / L[0] <= dt), self.levels[-1])
        n, lo, hi, last = level
        bw = self.span / n
        k0 = min(n - 1, max(0, math.floor(x0 / bw)))
        k1 = n - 1 if x1 == math.inf else min(n - 1, max(k0, math.ceil(x1 / bw) - 1))
        return ([min(lo[k][s] for k in range(k0, k1 + 1)) for s in (0, 1)],
                [max(hi[k][s] for k in range(k0, k1 + 1)) for s in (0, 1)], last[k1])


# ------------------------------------------------------------------ page state
GEOMETRY = """(() => {
  const r = (id) => { const e = document.getElementById(id); const b = e.getBoundingClientRect();
    return {left: b.left, top: b.top, width: b.width, height: b.height, pixels: e.width,
            data: Object.assign({}, e.dataset)}; };
  const w = document.getElementById('window').dataset;
  return {timeline: r('timeline'), series: r('series'), zoomIn: r('zoom-in'), zoomOut: r('zoom-out'),
          zoomReset: r('zoom-reset'), header: r('title'), view: [Number(w.viewStart), Number(w.viewEnd)],
          span: Number(w.span), draws: Number(document.documentElement.dataset.draws),
          errors: document.documentElement.dataset.errors, dpr: window.devicePixelRatio,
          innerWidth: window.innerWidth, innerHeight: window.innerHeight};
})()"""
TIP = """(() => { const t = document.getElementById('tip'); const r = t.getBoundingClientRect();
  return {visible: !t.hidden && t.offsetWidth > 0 && getComputedStyle(t).display !== 'none', text: t.textContent,
          rect: [r.left, r.top, r.right, r.bottom],
          room: [document.documentElement.clientWidth, document.documentElement.clientHeight]}; })()"""


# Queues the page's requestAnimationFrame callbacks until __depotReleaseFrames() runs them.
HOLD_FRAMES = '''(() => {
  const raf = window.requestAnimationFrame.bind(window), held = [];
  window.requestAnimationFrame = (f) => { held.push(f); return held.length; };
  window.__depotReleaseFrames = () => { window.requestAnimationFrame = raf; for (const f of held.splice(0)) raf(f); };
})();'''


def state(br):
    return br.evaluate(GEOMETRY)


def wait_draw(br, draws, timeout):
    """Waits for a redraw after draw number `draws`; the page state after it, or None."""
    ok = br.wait_for('Number(document.documentElement.dataset.draws) > %d' % draws, timeout)
    return state(br) if ok else None


def plot(g, canvas):
    d = g[canvas]['data']
    return float(d['plotLeft']), float(d['plotTop']), float(d['plotWidth']), float(d['plotHeight'])


def page_sane(br, g, ck, what, height=(700, 900)):
    good = ck(not br.problems and g['errors'] == '0',
              what + ': no script or console errors' + ('' if not br.problems else ' -- ' + '; '.join(br.problems[:5])))
    # --window-size=1400,900 is the window; the page gets 1400 x (900 less the window's frame)
    need = [k for k in ('plotLeft', 'plotTop', 'plotWidth', 'plotHeight') for c in ('timeline', 'series')
            if k not in g[c]['data']] + [k for k, v in (('data-view-start/end', g['view']), ('data-span', [g['span']]))
                                          if not all(isinstance(x, (int, float)) and x == x for x in v)]
    if not ck(not need, what + ': the page reports its plot rectangles and visible time range'
              + ('' if not need else ' -- missing ' + ', '.join(sorted(set(need))))):
        return False
    good &= ck(g['dpr'] == 1 and g['innerWidth'] == 1400 and height[0] <= g['innerHeight'] <= height[1],
               what + ': viewport %sx%s at device pixel ratio %s' % (g['innerWidth'], g['innerHeight'], g['dpr']))
    _, _, pw, _ = plot(g, 'timeline')
    for name in ('timeline', 'series'):
        good &= ck(g[name]['pixels'] == g[name]['width'] and pw == int(g['timeline']['data']['columns']),
                   what + ': the %s canvas is as wide on screen as its drawing (%.1f css px, %d pixels)'
                   % (name, g[name]['width'], g[name]['pixels']))
    good &= ck(g['series']['top'] + g['series']['height'] < g['innerHeight'],
               what + ': both canvases are inside the viewport')
    return good


# ------------------------------------------------------------------ hover
def check_hover(br, model, ck, what, columns_at=[0.5] + [k / 40 for k in range(4, 37)], again=False):
    """Hovers over the tallest band of a column, checks the tooltip against the trace. When the
    pixel under the mouse has another colour and the page has redrawn since the hover was
    aimed (a late redraw: another view or geometry), aims once more at the new drawing."""
    g = state(br)
    left, top, pw, ph = plot(g, 'timeline')
    cols, view = int(pw), tuple(g['view'])
    tl = g['timeline']['data']
    if not ck(tl.get('mode') == 'bands', what + ': single allocations drawn (mode %r)' % tl.get('mode')):
        return
    ymax = model.ymax(view, cols)
    ck(float(tl['ymax']) == ymax, what + ': the band stack is as high as the trace says (%s = %d bytes)' % (tl['ymax'], ymax))
    scale = ph / (ymax * 1.04)
    target = None  # the middle column if it has a band of 6 pixels or more, else the tallest band
    for frac in columns_at:
        c = int(cols * frac)
        bands = model.column_bands(view, cols, c, int(ph), scale)
        best = max(bands, key=lambda b: b[2] - b[1], default=None)
        if best and best[2] - best[1] >= 6 and (not target or best[2] - best[1] > target[1][2] - target[1][1]):
            target = (c, best, len(bands))
            if frac == 0.5:
                break
    if not ck(target, what + ': a band at least 6 pixels high in a column to hover over'):
        return
    c, (i, r0, r1), nbands = target
    a = model.allocs[i]
    x = g['timeline']['left'] + left + c + 0.5
    y = math.floor(g['timeline']['top'] + top + (r0 + r1) / 2)
    br.mouse('mouseMoved', x, y)
    tip = br.wait_for(TIP.replace('return {', 'return t.hidden ? null : {'), 5) or br.evaluate(TIP)
    text = tip['text']
    ck(tip['visible'], what + ': hovering at (%.1f, %.1f) shows the tooltip' % (x, y))
    l_, t_, r_, b_ = tip['rect']
    ck(l_ >= 0 and t_ >= 0 and r_ <= tip['room'][0] and b_ <= tip['room'][1] and not (l_ <= x <= r_ and t_ <= y <= b_),
       what + ': the whole tooltip is on screen, not under the scrollbar nor over the mouse (%.0f-%.0f x %.0f-%.0f in %dx%d)'
       % (l_, r_, t_, b_, tip['room'][0], tip['room'][1]))
    lifetime = ('at least ' if a['flags'] & 3 else '') + fmt_time(a['end'] - a['start'])
    expect = ['address 0x%x' % a['address'], '(%d B), requested %d B' % (a['size'], a['requested']),
              'lifetime ' + lifetime, 'stream 0x%x, thread 0x%x' % (a['stream'], a['thread']), 'allocation #%d ' % i]
    missing = [e for e in expect if e not in text]
    ck(not missing, what + ': the tooltip names allocation #%d of the trace (column %d, rows %d-%d of %d bands): %s%s'
       % (i, c, r0, r1, nbands, ' | '.join(expect), '' if not missing else ' -- missing %s in %r' % (missing, text)))
    # what is drawn there: the pixel under the mouse has this allocation's colour. Up to three
    # screenshots 0.1 s apart: one CI run sampled another colour once (the tooltip right), as
    # if the screenshot had caught a frame not yet composited; a wrong drawing fails all three.
    want = model.colour(i)
    seen = []
    for attempt in range(3):
        px = png_decode(br.screenshot({'x': math.floor(x), 'y': math.floor(y), 'width': 1, 'height': 1}))[2][0][0]
        seen.append('rgb%s' % (px,))
        if all(abs(p - q) <= 3 for p, q in zip(px, want)):
            break
        time.sleep(0.1)
    right = all(abs(p - q) <= 3 for p, q in zip(px, want))
    now = state(br) if not right else g
    where = lambda s: (s['draws'], tuple(s['view']), s['timeline']['left'], s['timeline']['top'],
                       s['timeline']['width'], s['timeline']['pixels'], s['dpr'])
    if not right and not again and where(now) != where(g):
        return check_hover(br, model, ck, what + ' (aimed again: the page redrew after the hover)', columns_at, True)
    ck(right, what + ': the screen pixel under the mouse has the allocation\'s colour (%s, expected rgb%s; '
       'page before and after the hover: draws, view, timeline left/top/width/pixels, dpr %s -> %s)'
       % (' then '.join(seen), want, where(g), where(now)))
    return x, y


def allocations_under(model, g, x, y, slack=1.0):
    """The allocations the page's hover rule may name at (x, y): the bands within `slack`
    pixels of the mouse in its column (page.js timelineHover), or [] over empty space."""
    left, top, pw, ph = plot(g, 'timeline')
    cols, view = int(pw), tuple(g['view'])
    c = math.floor(x - g['timeline']['left']) - int(left)
    row = y - g['timeline']['top'] - top
    scale = ph / (model.ymax(view, cols) * 1.04)
    x0, x1 = model.edge(view, cols, c), model.edge(view, cols, c + 1)
    out, acc = [], 0
    for i in range(bisect.bisect_left(model.starts, x1)):
        a = model.allocs[i]
        if a['end_eff'] <= x0:
            continue
        lo, acc = acc, acc + a['size']
        if ph - acc * scale - slack <= row <= ph - lo * scale + slack:
            out.append(i)
    return out


def aggregate_tip_ok(model, g, x, text):
    """An aggregated column's tooltip: the peak of live bytes in its buckets is the trace's."""
    left, _, pw, _ = plot(g, 'timeline')
    c = math.floor(x - g['timeline']['left']) - int(left)
    _, hi, _ = model.series_at(tuple(g['view']), int(pw), c)
    m = re.search('live at the bucket\u2019s peak: (\\S+ \\S+)', text)
    return bool(m) and bytes_match(m.group(1), hi[0]) and 'zoom in to see single allocations' in text


def check_tip_follows_zoom(br, model, ck, what, x, y, wait_s):
    """With the mouse still over a band, the wheel zooms out: the tooltip must describe what
    is under the mouse after the redraw, not the allocation that was there before."""
    g = state(br)
    before = br.evaluate(TIP)['text']
    br.mouse('mouseWheel', x, y, deltaX=0, deltaY=1000)
    g = wait_draw(br, g['draws'], wait_s)
    if not ck(g, what + ': the wheel redraws'):
        return
    br.pump(0.2)
    tip = br.evaluate(TIP)
    under = allocations_under(model, g, x, y)
    shown = re.search(r'allocation #(\d+) ', tip['text']) if tip['visible'] else None
    if g['timeline']['data'].get('mode') == 'aggregate':
        ck(tip['visible'] and aggregate_tip_ok(model, g, x, tip['text']),
           what + ': after zooming out with the mouse still, the tooltip describes the aggregated bucket under it'
           ' (%r; before: %s)' % (tip['text'].replace('\n', ' | ')[:110], (re.search(r'allocation #\d+', before) or [''])[0]))
        return
    ck((shown and int(shown.group(1)) in under) if under else not tip['visible'],
       what + ': after zooming with the mouse still, the tooltip shows what is under it now: %s (the trace: %s; before: %s)'
       % ('allocation #' + shown.group(1) if shown else 'visible, %r' % tip['text'][:60] if tip['visible'] else 'hidden',
          ', '.join('#%d' % i for i in under) or 'nothing', (re.search(r'allocation #\d+', before) or [''])[0]))


def check_series_hover(br, model, ck, what):
    g = state(br)
    left, top, pw, ph = plot(g, 'series')
    cols, view = int(pw), tuple(g['view'])
    # a column where the allocated bytes change (a range) and one where nothing happens
    spans = [(model.series_at(view, cols, c), c) for c in range(0, cols, 3)]
    busy = max(spans, key=lambda s: s[0][1][0] - s[0][0][0])[1]
    quiet = next((c for (lo, hi, _), c in spans[len(spans) // 3:] if lo == hi), None)
    for c, kind in ((busy, 'a busy column'), (quiet, 'a quiet column')):
        if not ck(c is not None, what + ': found %s' % kind):
            continue
        lo, hi, last = model.series_at(view, cols, c)
        x, y = g['series']['left'] + left + c + 0.5, g['series']['top'] + top + ph / 2
        br.mouse('mouseMoved', x, y)
        tip = br.wait_for(TIP.replace('return {', "return t.hidden || !t.textContent.includes('reserved') ? null : {"), 5) \
            or br.evaluate(TIP)
        text = tip['text']
        ck(tip['visible'], what + ': hovering over %s of the series (x %.1f) shows the tooltip' % (kind, x))
        for s, name in enumerate(('allocated', 'reserved')):
            m = re.search(name + r' (\S+ \S+) \(range (\S+ \S+) \u2013 (\S+ \S+)\)', text)
            good = bool(m) and bytes_match(m.group(1), last[s]) and bytes_match(m.group(2), lo[s]) and bytes_match(m.group(3), hi[s])
            ck(good, what + ': %s, %s: %s; the trace says %d (range %d - %d)'
               % (kind, name, m.group(0) if m else 'missing in %r' % text, last[s], lo[s], hi[s]))
        ck(re.search(r'fragmentation [0-9.]+% \(range', text), what + ': %s: fragmentation shown' % kind)


def check_tip_hides(br, ck, what):
    g = state(br)
    br.mouse('mouseMoved', g['header']['left'] + 2, g['header']['top'] + 2)
    hidden = br.wait_for("document.getElementById('tip').hidden", 5)
    ck(hidden, what + ': moving the mouse off the canvas hides the tooltip')


# ------------------------------------------------------------------ zoom
def close(x, y, tol):
    return abs(x - y) <= tol


def check_zoom(br, model, ck, what, wait_s=DRAW_TIMEOUT, screenshot=None):
    """Wheel, deep zoom, drag, double-click, buttons. Returns the hover text at the deep zoom."""
    g = state(br)
    left, top, pw, ph = plot(g, 'timeline')
    span = g['span']
    ck(g['view'] == [0, span] and close(span, model.span, 0.5),
       what + ': starts with the whole trace in view (%s of %g ns)' % (g['view'], model.span))
    ck(g['timeline']['data'].get('mode') == 'aggregate',
       what + ': whole trace aggregated (%s allocations overlap it)' % model.overlapping(tuple(g['view']), int(pw)))
    cx = g['timeline']['left'] + left + round(pw * 0.3) + 0.5
    cy = g['timeline']['top'] + top + ph / 2
    frac = (cx - g['timeline']['left'] - left) / pw
    br.mouse('mouseMoved', cx, cy)
    tip = br.wait_for(TIP.replace('return {', 'return t.hidden ? null : {'), 5) or br.evaluate(TIP)
    ck(tip['visible'] and aggregate_tip_ok(model, g, cx, tip['text']),
       what + ': hovering over the aggregated timeline shows the bucket\'s peak live bytes of the trace (%r)'
       % tip['text'].replace('\n', ' | ')[:110])

    def wheel(delta, x=cx, y=cy, canvas='timeline'):
        nonlocal g
        before = g
        br.mouse('mouseWheel', x, y, deltaX=0, deltaY=delta)
        after = wait_draw(br, before['draws'], wait_s)
        if after is None:
            return None
        g = after
        return before['view'], after['view']

    for delta, canvas in ((-100, 'timeline'), (-240, 'series'), (180, 'timeline')):
        box = g[canvas]
        x = box['left'] + left + round(pw * 0.3) + 0.5
        r = wheel(delta, x, box['top'] + top + 10, canvas)
        if not ck(r, what + ': a wheel event (deltaY %d) over the %s redraws' % (delta, canvas)):
            return None
        (a, b), (a2, b2) = r
        w, w2 = b - a, b2 - a2
        factor = math.exp(delta * 0.002)
        t, t2 = a + frac * w, a2 + frac * w2
        ck(close(w2, w * factor, w * 1e-9),
           what + ': wheel deltaY %d over the %s scales the view by exp(%g) = %.6f (got %.6f)'
           % (delta, canvas, delta * 0.002, factor, w2 / w))
        ck(close(t, t2, w2 / pw),
           what + ': the time under the mouse stays put (%.3f ns -> %.3f ns, a pixel is %.3f ns)' % (t, t2, w2 / pw))

    # far in: single allocations
    steps = 0
    while g['timeline']['data'].get('mode') != 'bands' and steps < 30:
        if not wheel(-500):
            break
        steps += 1
    view, cols = tuple(g['view']), int(pw)
    n = model.overlapping(view, cols)
    tl = g['timeline']['data']
    ck(tl.get('mode') == 'bands' and int(tl.get('bands', -1)) == n and 0 < n <= 20000 and n < len(model.allocs),
       what + ': after %d more wheel steps in, single allocations drawn: %s bands = %d allocations overlapping '
       '%.0f-%.0f ns in the trace (of %d)' % (steps, tl.get('bands'), n, view[0], view[1], len(model.allocs)))
    hover = None
    if tl.get('mode') == 'bands':
        hover = check_hover(br, model, ck, what + ', zoomed in')
        if screenshot:
            png = br.screenshot()
            open(screenshot, 'wb').write(png)
            try:
                w_, h_, _ = (struct.unpack('>II', png[16:24]) + (None,)) if png[:8] == b'\x89PNG\r\n\x1a\n' else (0, 0, 0)
                crc_ok = zlib.crc32(png[12:29]) == struct.unpack('>I', png[29:33])[0]
            except struct.error:
                w_, h_, crc_ok = 0, 0, False
            ck(crc_ok and (w_, h_) == (g['innerWidth'], g['innerHeight']) and os.path.getsize(screenshot) > 10000,
               what + ': screenshot of the zoomed page: %s, %d bytes, a %dx%d PNG' % (screenshot, len(png), w_, h_))

    # drag pans: 200 px to the left moves the view 200/plot-width of its width later
    a, b = g['view']
    x0 = g['timeline']['left'] + left + round(pw * 0.6) + 0.5
    draws = g['draws']
    br.mouse('mousePressed', x0, cy, button='left', buttons=1, clickCount=1)
    for k in range(1, 5):
        br.mouse('mouseMoved', x0 - 50 * k, cy, button='left', buttons=1)
    br.mouse('mouseReleased', x0 - 200, cy, button='left', buttons=0, clickCount=1)
    g2 = wait_draw(br, draws, wait_s)
    if ck(g2, what + ': dragging redraws'):
        g = g2
        a2, b2 = g['view']
        shift = 200 / pw * (b - a)
        ck(close(a2, a + shift, (b - a) * 1e-9) and close(b2 - a2, b - a, (b - a) * 1e-9),
           what + ': dragging 200 px left pans %.1f ns later (got %.1f ns, width kept)' % (shift, a2 - a))
        br.pump(0.2)
        g = state(br)
        ck(g['view'] == [a2, b2], what + ': releasing the button ends the drag (view %s)' % g['view'])
        br.mouse('mouseMoved', x0 - 300, cy)
        br.pump(0.3)
        g = state(br)
        ck(g['view'] == [a2, b2], what + ': moving after the release does not pan')

        hover = check_hover(br, model, ck, what + ', panned')
        if hover:
            check_tip_follows_zoom(br, model, ck, what + ', panned', *hover, wait_s)
        g = state(br)

    # double-click: the whole trace
    draws = g['draws']
    br.click(cx, cy, count=2)
    g2 = wait_draw(br, draws, wait_s)
    br.pump(0.2)
    g2 = state(br) if g2 else None
    ck(g2 and g2['view'] == [0, span], what + ': double-click shows the whole trace again (%s)' % (g2 and g2['view']))
    g = g2 or state(br)

    # the buttons, by real clicks at their centres
    for button, expect in (('zoomIn', lambda a, b: (a + (b - a) / 4, b - (b - a) / 4)),
                           ('zoomIn', lambda a, b: (a + (b - a) / 4, b - (b - a) / 4)),
                           ('zoomOut', lambda a, b: ((a + b) / 2 - (b - a), (a + b) / 2 + (b - a))),
                           ('zoomReset', lambda a, b: (0, span))):
        r = g[button]
        a, b = g['view']
        draws = g['draws']
        br.click(r['left'] + r['width'] / 2, r['top'] + r['height'] / 2)
        g2 = wait_draw(br, draws, wait_s)
        if not ck(g2, what + ': clicking #%s redraws' % re.sub('[A-Z]', lambda m: '-' + m.group(0).lower(), button)):
            continue
        g = g2
        ea, eb = expect(a, b)
        ck(close(g['view'][0], ea, span * 1e-9) and close(g['view'][1], eb, span * 1e-9),
           what + ': #%s: %.1f-%.1f ns -> %.1f-%.1f ns (expected %.1f-%.1f)'
           % (re.sub('[A-Z]', lambda m: '-' + m.group(0).lower(), button), a, b, g['view'][0], g['view'][1], ea, eb))
    ck(not br.problems and g['errors'] == '0',
       what + ': no script or console errors after the interaction' + ('' if not br.problems else ' -- ' + '; '.join(br.problems[:5])))
    return hover


def check_line_wheel(br, ck, what):
    """A wheel that counts in lines (Firefox's mouse wheel: deltaMode 1, deltaY 3 a notch) zooms
    like 16 pixels a line. CDP's mouseWheel only sends pixels: a synthetic WheelEvent here."""
    g = state(br)
    left, top, pw, ph = plot(g, 'timeline')
    x, y = g['timeline']['left'] + left + pw / 2, g['timeline']['top'] + top + ph / 2
    br.evaluate("document.getElementById('timeline').dispatchEvent(new WheelEvent('wheel', {deltaY: -3, deltaMode: 1, "
                "clientX: %r, clientY: %r, bubbles: true, cancelable: true}))" % (x, y))
    g2 = wait_draw(br, g['draws'], DRAW_TIMEOUT)
    (a, b), (a2, b2) = g['view'], (g2 or g)['view']
    ck(g2 and close(b2 - a2, (b - a) * math.exp(-3 * 16 * 0.002), (b - a) * 1e-9),
       what + ': a wheel event in lines (synthetic, deltaMode 1, deltaY -3) zooms by exp(-48 * 0.002) (got %.4f)'
       % ((b2 - a2) / (b - a)))


# ------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--memviz', required=True)
    ap.add_argument('--make-trace', required=True)
    ap.add_argument('--workdir', required=True)
    ap.add_argument('--events-zoom', type=int, default=100000, help='events of the trace for the zoom checks')
    ap.add_argument('--page-js', default=None, help='iteration only: put this page.js into the pages')
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    w = lambda name: os.path.join(a.workdir, name)  # noqa: E731
    ck = Checker()
    t_start = time.monotonic()

    chromium = find_chromium()
    if not chromium:
        print('FAIL  chromium not found: this test needs Debian\'s `chromium` package '
              '(tools/bootstrap installs it; or apt-get install chromium, or set DEPOT_CHROMIUM)')
        return 1

    # the pages: a small trace (every allocation a band) and a larger one (aggregated when whole)
    p = run([a.make_trace, '--events', 600, '--capacity', 100000, '--trace', w('small.json'), '--snapshot', w('snapshot.json')])
    if not ck(p.returncode == 0, 'memviz-make-trace (small) ran: ' + (p.stdout + p.stderr).strip()):
        return 1
    p = run([a.make_trace, '--events', a.events_zoom, '--trace', w('zoom.json')])
    if not ck(p.returncode == 0, 'memviz-make-trace (%d events) ran: ' % a.events_zoom + (p.stdout + p.stderr).strip()):
        return 1
    for name, args in (('small', ['--trace', w('small.json'), '--snapshot', w('snapshot.json')]),
                       ('zoom', ['--trace', w('zoom.json')])):
        p = run([a.memviz, *args, '-o', w(name + '.html')])
        if not ck(p.returncode == 0, 'depot-memviz %s: exit 0' % name):
            print(p.stdout + p.stderr)
            return 1
        if a.page_js:  # iteration: swap the script the binary embedded for the working copy
            html = open(w(name + '.html'), encoding='utf-8').read()
            m = re.search(r"<script>\n(// SPDX-License-Identifier: Apache-2.0\n// depot-memviz page:.*?)\n</script>", html, re.S)
            js = open(a.page_js, encoding='utf-8').read()
            html = html[:m.start(1)] + js + html[m.end(1):]
            open(w(name + '.html'), 'w', encoding='utf-8').write(html)
    small, zoom = TraceModel(w('small.json')), TraceModel(w('zoom.json'))
    print('traces: small %d allocations over %.0f ns, zoom %d allocations over %.0f ns (read in %.1f s)'
          % (len(small.allocs), small.span, len(zoom.allocs), zoom.span, time.monotonic() - t_start))

    br = Browser(chromium, w('chromium.log'))
    RUNNING.append(br.proc)
    try:
        print('chromium: ' + br.start() + ' (DevTools over --remote-debugging-pipe)', flush=True)

        # ---- hover on the small page
        ready = br.open(w('small.html'))
        ck(ready, 'small page loaded and drew (data-ready="1")')
        g = state(br)
        if page_sane(br, g, ck, 'small page'):
            check_hover(br, small, ck, 'small page')
            check_hover(br, small, ck, 'small page, right edge', columns_at=[0.995, 0.99, 0.98, 0.97])
            check_tip_hides(br, ck, 'small page, timeline')
            check_series_hover(br, small, ck, 'small page')
            check_tip_hides(br, ck, 'small page, series')

        # ---- a window so tall that the page's scrollbar goes once the segment map is drawn
        height = br.evaluate('document.documentElement.scrollHeight') + 60
        br.call('Emulation.setDeviceMetricsOverride', {'width': 1400, 'height': height, 'deviceScaleFactor': 1, 'mobile': False})
        # Animation frames are held until the page is read: what it shows when it says ready
        # must already fit, not only after a redraw a frame later (CI read the page before that
        # frame once; holding the frames makes the check independent of the machine's speed).
        hold = br.call('Page.addScriptToEvaluateOnNewDocument', {'source': HOLD_FRAMES})['identifier']
        ck(br.open(w('small.html')), 'small page in a 1400x%d window loaded and drew' % height)
        g = state(br)
        br.evaluate('window.__depotReleaseFrames()')
        br.call('Page.removeScriptToEvaluateOnNewDocument', {'identifier': hold})
        ck(br.evaluate('document.documentElement.scrollHeight <= window.innerHeight'), 'small page, tall window: no scrollbar')
        page_sane(br, g, ck, 'small page, tall window', height=(height, height))
        if 'plotLeft' in g['timeline']['data']:  # near the right edge, where a stretched canvas is most off
            check_hover(br, small, ck, 'small page, tall window', columns_at=[0.97, 0.95, 0.9])
        br.call('Emulation.clearDeviceMetricsOverride')

        # ---- zoom on the larger page
        ready = br.open(w('zoom.html'))
        ck(ready, 'zoom page loaded and drew')
        g = state(br)
        if page_sane(br, g, ck, 'zoom page'):
            check_zoom(br, zoom, ck, 'zoom page', screenshot=w('zoomed.png'))
            check_line_wheel(br, ck, 'zoom page')

        # ---- negative controls: the checks must reject broken pages
        good = open(w('zoom.html'), encoding='utf-8').read()
        needle = "canvas.addEventListener('wheel',"
        ck(needle in good, 'negative control: the page has the wheel listener to remove')
        open(w('broken_wheel.html'), 'w', encoding='utf-8').write(good.replace(needle, "canvas.addEventListener('no-wheel',"))
        br.open(w('broken_wheel.html'))
        quiet = Checker(quiet=True)
        check_zoom(br, zoom, quiet, 'no wheel', wait_s=2)
        ck(quiet.failures and any('wheel' in f for f in quiet.failures),
           'negative control: a page without the wheel listener fails the zoom check (%d failed: %s)'
           % (len(quiet.failures), '; '.join(quiet.failures[:2])[:200]))

        good = open(w('small.html'), encoding='utf-8').read()
        needle = 'return allocationText(i);'
        ck(needle in good, 'negative control: the page has the hover lookup to break')
        open(w('broken_hover.html'), 'w', encoding='utf-8').write(good.replace(needle, 'return allocationText(i + 1);'))
        br.open(w('broken_hover.html'))
        quiet = Checker(quiet=True)
        check_hover(br, small, quiet, 'wrong allocation')
        ck(any('names allocation' in f for f in quiet.failures),
           'negative control: a tooltip naming the next allocation fails the hover check (%d failed)' % len(quiet.failures))
    except CdpError as e:
        ck(False, 'DevTools: %s' % e)
    except Exception:  # noqa: BLE001 -- a bug here is a failure with its traceback, not a hang
        ck(False, 'the test itself failed:\n' + traceback.format_exc())
    finally:
        br.close()

    print('%.1f s' % (time.monotonic() - t_start))
    print('%d checks failed' % len(ck.failures) if ck.failures else 'all checks passed')
    return 1 if ck.failures else 0


RUNNING = []  # the Chromium this test started, for the watchdog


def watchdog(signum, frame):
    print('FAIL  the test ran past %d s (watchdog)' % TOTAL_TIMEOUT, flush=True)
    for proc in RUNNING:
        proc.kill()
    os._exit(1)


if __name__ == '__main__':
    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(TOTAL_TIMEOUT)
    sys.exit(main())

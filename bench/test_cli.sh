#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_cli.sh DEPOT_BENCH: the CLI runs its default suite, writes valid JSON, and refuses
# bad arguments with a message naming them.
set -u
bench=$1
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if "$@"; then :; else echo "FAILED: $*"; fail=1; fi; }

"$bench" --size 4MiB --repetitions 3 --alloc-n 2000 --alloc-max 64KiB --alloc-max 4MiB \
  --live-blocks 1000 --live-blocks 10000 --live-blocks 3000000 --live-max 4KiB --live-pairs 20000 \
  --json "$tmp/r.json" > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "host:0" "$tmp/out"
check grep -q "copy device->device" "$tmp/out"
check python3 -c "import json,sys; r=json.load(open('$tmp/r.json')); s=r['suites'][0]; \
assert s['suite']=='info'; d=s['devices'][0]; assert d['id']=='host:0'; \
assert all(x['gbps']>0 for x in d['results']), d; a=r['suites'][1]; assert a['suite']=='alloc'; \
rows=a['rows']; h=[x for x in rows if x['device']=='host:0']; assert len(h)==6, rows; \
assert {x['allocator'] for x in h}=={'depot','depot-expandable','malloc'}; assert all(x['us_per_pair']>0 for x in rows), rows; \
assert all(x['teardown_us']>0 and x['cold'] is False for x in rows), rows; \
assert all(x['paired_ratio_to_depot']>0 and (x['allocator']!='depot' or x['paired_ratio_to_depot']==1) for x in rows), rows; \
g=[x for x in rows if x['device']!='host:0']; assert not g or {'depot'} <= {x['allocator'] for x in g}, g; \
gr={x['allocator']: x for x in a['growing'] if x['device']=='host:0'}; assert set(gr)=={'depot','depot-expandable'}, gr; \
o, e = gr['depot'], gr['depot-expandable']; assert o['peak_allocated'] > 0 and e['peak_allocated'] > 0, gr; \
assert e['peak_reserved'] == e['peak_allocated'] and o['peak_reserved'] > 2 * o['peak_allocated'], gr; \
assert e['segments_peak'] == 1, gr; \
assert 4 << 20 <= e['kept_reserved_after_empty_cache'] <= 6 << 20 < o['kept_reserved_after_empty_cache'], gr; \
m=[x for x in a['map_pages'] if x['device']=='host:0']; assert len(m)==1 and m[0]['pages']==32, a['map_pages']; \
rh=a['raw_handles']; assert [x['handles'] for x in rh]==[5000, 10000, 15000, 20000], rh; \
assert all(x['us_per_new_handle']>0 and 1 <= x['stream_caches'] <= 4 for x in rh), rh; \
assert m[0]['page_bytes']==2 << 20 and m[0]['per_page_ms'] > 0 and m[0]['one_call_ms'] > 0, m; \
v=r['suites'][2]; assert v['suite']=='live' and v['pairs']==20000, v; \
h=[x for x in v['rows'] if x['device']=='host:0']; assert len(h)==4, h; \
assert {x['allocator'] for x in h}=={'depot','malloc'} and {x['live_blocks'] for x in h}=={1000, 10000}, h; \
assert all(x['us_per_pair']>0 and x['max_size']==4096 and len(x['run_us_per_pair'])==3 and not x['cold'] for x in h), h; \
d=[x for x in h if x['allocator']=='depot' and x['live_blocks']==10000][0]; \
assert d['allocated_bytes'] > 10000 * 512 and d['reserved_bytes'] >= d['allocated_bytes'], d; \
gw=[x for x in v['growth'] if x['device']=='host:0']; assert len(gw)==2 and all(x['from_blocks']==1000 and \
x['to_blocks']==10000 and x['growth']>0 for x in gw), gw; \
assert r['suites'][3]['suite']=='ops', [x['suite'] for x in r['suites']]"
check grep -q "3000000     4 KiB   skipped: ~5.72 GiB live, above --live-cap 1.00 GiB" "$tmp/out"

"$bench" info --device host --size 1MiB --repetitions 2 > "$tmp/out" 2>&1
check test $? -eq 0

"$bench" alloc --device host --alloc-n 2000 --alloc-max 64KiB --alloc-streams 3 --alloc-reps 1 --alloc-cold \
  --json "$tmp/a.json" > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "3 stream(s) each" "$tmp/out"
check grep -q "each run right after the previous allocator's run (--alloc-cold)" "$tmp/out"
check python3 -c "import json; r=json.load(open('$tmp/a.json')); rows=r['suites'][0]['rows']; \
assert rows and all(x['streams']==3 and x['us_per_pair']>0 and x['cold'] for x in rows), rows; \
assert r['options']['alloc_streams']==3 and r['options']['alloc_cold'] is True"

# The rows alone: no growing-requests, mapping, lock, reader, destruction or fixed-pool parts.
"$bench" alloc --device host --alloc-n 2000 --alloc-max 64KiB --alloc-reps 1 --alloc-rows-only \
  --json "$tmp/o.json" > "$tmp/out" 2>&1
check test $? -eq 0
check python3 -c "import json; r=json.load(open('$tmp/o.json')); a=r['suites'][0]; rows=a['rows']; \
assert {x['allocator'] for x in rows}=={'depot','depot-expandable','malloc'}, rows; \
assert all(x['us_per_pair']>0 for x in rows), rows; assert r['options']['alloc_rows_only'] is True; \
assert not a['growing'] and not a['map_pages'] and a['cache_lock'] is None and a['fixed_pool'] is None, a; \
assert a['raw_handles'] is None, a"
check sh -c "! grep -q 'growing requests\|fixed pool\|raw stream handles' '$tmp/out'"

# Instances side by side: depot, depot/2, depot/3 in the same rounds, each with its own runs;
# tools/layout-table reads them.
"$bench" alloc --device host --alloc-n 2000 --alloc-max 64KiB --alloc-reps 2 --alloc-rows-only \
  --alloc-instances 3 --alloc-only depot --json "$tmp/i.json" > "$tmp/out" 2>&1
check test $? -eq 0
check python3 -c "import json; r=json.load(open('$tmp/i.json')); rows=r['suites'][0]['rows']; \
assert [x['allocator'] for x in rows]==['depot','depot/2','depot/3'], rows; \
assert all(len(x['run_us_per_pair'])==2 and x['us_per_pair']>0 for x in rows), rows; \
assert r['options']['alloc_instances']==3"
check sh -c "'$(dirname "$0")/../tools/layout-table' '$tmp/i.json' | grep -q \"instances' medians\""

"$bench" staging --device host --staging-sizes 64KiB --staging-sizes 1MiB --staging-steps 4 \
  --staging-reps 1 --repetitions 2 --json "$tmp/s.json" > "$tmp/out" 2>&1
check test $? -eq 0
check python3 -c "import json; s=json.load(open('$tmp/s.json'))['suites'][0]; assert s['suite']=='staging'; \
rows=s['rows']; assert [r['bytes'] for r in rows]==[65536, 1048576], rows; \
assert all(len(r['loops'])==6 and all(l['ms']>0 and l['efficiency']>0 for l in r['loops']) for r in rows), rows"

for bad in "--device tpu" "--size 0" "--repetitions 0" "--size lots" "nosuchsuite" "--threads 0" "--alloc-streams 0" "--alloc-n 0" "--staging-sizes 1" "--compute-us -1" "--staging-steps 1" "--staging-workers 0" "--live-blocks 0" "--live-max 0" "--live-pairs 0" "--alloc-instances 0" "--alloc-instances 17"; do
  # shellcheck disable=SC2086
  if "$bench" $bad > "$tmp/err" 2>&1; then
    echo "FAILED: depot-bench $bad was accepted"; fail=1
  fi
  word=${bad#--}; word=${word%% *}
  check grep -qi -- "$word" "$tmp/err"
done
# Fewer allocations than threads: a thread would time nothing (the workload floor was inf).
if "$bench" alloc --device host --alloc-n 2 --threads 4 > "$tmp/err" 2>&1; then
  echo "FAILED: depot-bench alloc --alloc-n 2 --threads 4 was accepted"; fail=1
fi
check grep -q -- "--alloc-n 2 is below --threads 4" "$tmp/err"
# tools/alloc-ab: two copies of this build (the build directory and a copy of its
# libdepot.so), then bad input.
ab="$(dirname "$0")/../tools/alloc-ab"
libdir="$(dirname "$bench")/.."
mkdir "$tmp/copy" && cp "$libdir/libdepot.so" "$tmp/copy/"
"$ab" --rounds 2 --bench "$bench" "$libdir" "$tmp/copy" -- --alloc-n 2000 --alloc-max 4KiB \
  > "$tmp/ab" 2>&1
check test $? -eq 0
check grep -q "best µs per allocate+free pair" "$tmp/ab"
check python3 -c "import re; t=open('$tmp/ab').read().split('== every run')[0]; \
rows=[l.split() for l in t.splitlines() if re.match(r'^2000 4 KiB', l)]; assert len(rows)==1, t; \
assert len(rows[0])==5 and all(float(x)>0 for x in rows[0][3:]), rows"
check test "$(grep -c '^ *2000 ' "$tmp/ab")" -eq 5  # 1 summary row + 2 rounds x 2 builds
if "$ab" --rounds 1 --bench "$bench" "$tmp" > "$tmp/err" 2>&1; then
  echo "FAILED: alloc-ab accepted a directory without libdepot.so"; fail=1
fi
check grep -q "libdepot.so not found" "$tmp/err"
if "$ab" --bench "$bench" > "$tmp/err" 2>&1; then
  echo "FAILED: alloc-ab ran with no build named"; fail=1
fi
check grep -q "at least one directory" "$tmp/err"

[ $fail -eq 0 ] && echo "bench-cli: all checks passed"
exit $fail

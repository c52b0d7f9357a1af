#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_plan_cli.sh DEPOT_PLAN DEPOT_BENCH TRACE: depot-plan plans and verifies the recorded
# trace and an RMM log; depot-bench replay replays them (real host and a simulated device);
# bad and truncated files give exit status 2 (plan) or 1 (bench) and a message naming the
# line or field.
set -u
plan=$1
bench=$2
trace=$3
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if "$@"; then :; else echo "FAILED: $*"; fail=1; fi; }

"$plan" "$trace" > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "lower bound" "$tmp/out"
check grep -q "planned arena" "$tmp/out"
check grep -q "caching allocator peak reserved" "$tmp/out"
check grep -q "plan verified" "$tmp/out"

cat > "$tmp/rmm.csv" <<'CSV'
Thread,Time,Action,Pointer,Size,Stream
140573312345856,09:37:17.100000,allocate,0x7f8a40000000,1048576,0x0
140573312345856,09:37:17.100100,allocate,0x7f8a40100000,2097152,0x0
140573312345857,09:37:17.100200,free,0x7f8a40000000,1048576,0x0
140573312345857,09:37:17.100300,allocate,0x7f8a40000000,524288,0x5
140573312345856,09:37:17.100400,free,0x7f8a40100000,2097152,0x0
140573312345857,09:37:17.100500,free,0x7f8a40000000,524288,0x5
CSV
"$plan" --full "$tmp/rmm.csv" > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "rmm.csv" "$tmp/out"
check grep -q "3145728" "$tmp/out"   # lower bound: 1 MiB + 2 MiB alive together
check grep -q "1.0000x" "$tmp/out"

"$bench" replay "$tmp/rmm.csv" --alloc-reps 1 > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "2 threads" "$tmp/out"
"$bench" replay --replay-file "$trace" --capacity 40MiB --alloc-conf max_split_size_mb:4 --alloc-reps 1 \
  --json "$tmp/r.json" > "$tmp/out" 2>&1
check test $? -eq 0
check grep -q "simulated" "$tmp/out"
check python3 -c "import json; r=json.load(open('$tmp/r.json')); s=r['suites'][0]; assert s['suite']=='replay'; \
rows=s['rows']; d=[x for x in rows if x['allocator']=='depot'][0]; assert d['peak_reserved_bytes']<=40<<20, d; \
assert len(d['out_of_memory'])>0, d; assert all(x['ms']>0 for x in rows)"

# bad and truncated files
head -c 3000 "$trace" > "$tmp/cut.json"
head -n 4 "$tmp/rmm.csv" > "$tmp/cut.csv"; printf '1,09:37:18.0,allo' >> "$tmp/cut.csv"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,09:37:18.0,allocate,0x10,lots,0x0\n' > "$tmp/bad.csv"
printf '{"format":"depot.trace.v1","events":[{"kind":"alloc","address":1,"size":-4}]}' > "$tmp/bad.json"
printf '' > "$tmp/empty"
for f in cut.json:truncated cut.csv:"line 5" bad.csv:"line 2" bad.json:"event 0" empty:empty nothere:"no such file"; do
  file=${f%%:*}; word=${f#*:}
  "$plan" "$tmp/$file" > "$tmp/err" 2>&1
  rc=$?
  if [ $rc -ne 2 ]; then echo "FAILED: depot-plan $file exited $rc, not 2"; cat "$tmp/err"; fail=1; fi
  check grep -q -- "$word" "$tmp/err"
  [ "$file" = nothere ] && continue
  if "$bench" replay "$tmp/$file" > "$tmp/err" 2>&1; then echo "FAILED: depot-bench replay $file succeeded"; fail=1; fi
  check grep -q -- "$word" "$tmp/err"
done
for bad in "--alignment 3" "--capacity 1" "--alloc-conf nosuch:1" ""; do
  # shellcheck disable=SC2086
  "$plan" $bad "$trace" > "$tmp/err" 2>&1
  rc=$?
  [ -z "$bad" ] && continue
  if [ $rc -ne 2 ]; then echo "FAILED: depot-plan $bad exited $rc"; fail=1; fi
done
"$plan" > "$tmp/err" 2>&1
check test $? -eq 2
for bad in "replay --capacity 1" "replay --alloc-conf nosuch:1" "replay nothere.json"; do
  # shellcheck disable=SC2086
  if "$bench" $bad "$trace" > "$tmp/err" 2>&1; then echo "FAILED: depot-bench $bad accepted"; fail=1; fi
done
[ $fail -eq 0 ] && echo "plan-cli: all checks passed"
exit $fail

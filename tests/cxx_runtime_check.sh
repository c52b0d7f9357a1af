#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/cxx_runtime_check.sh CXX [ARG...]: tools/cxx-runtime (meson.build, -Dcxx_runtime=auto) names no
# runtime for CXX when CXX links the shared C++ runtime, and names a working shared
# libstdc++ for CXX with -static-libstdc++; and what it fixes is real: with a static runtime
# in a library and in the program, an exception the program throws and the library catches
# leaves the program's std::uncaught_exceptions() at 1; linked to the runtime named, at 0.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: cxx_runtime_check.sh CXX [ARG...]"; exit 2; }
cxx=("$@")
tool="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/cxx-runtime"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
printf '#!/bin/sh\nexec %s -static-libstdc++ "$@"\n' "$(printf '%q ' "${cxx[@]}")" > "$d/static-cxx"
chmod +x "$d/static-cxx"
if ! printf 'int main() {}\n' | "$d/static-cxx" -x c++ - -o "$d/t" 2> /dev/null; then
  echo "SKIP: ${cxx[*]} cannot link libstdc++ statically here"; exit 77
fi
named=$("$tool" "${cxx[@]}")
if readelf -d "$d/t" | grep -q 'NEEDED.*libstdc++'; then fail "-static-libstdc++ still linked the shared runtime"; fi
printf 'int main() {}\n' | "${cxx[@]}" -x c++ - -o "$d/u"
if readelf -d "$d/u" | grep -q 'NEEDED.*libstdc++' && [ -n "$named" ]; then
  fail "${cxx[*]} links the shared runtime, yet cxx-runtime named '$named'"
fi
runtime=$("$tool" "$d/static-cxx")
[ -n "$runtime" ] && [ -f "$runtime" ] || fail "cxx-runtime named no shared runtime for '${cxx[*]} -static-libstdc++'"
echo "cxx-runtime: '${cxx[*]}' -> '${named}' (none: it links the shared runtime); with -static-libstdc++ -> $runtime"

cat > "$d/lib.cpp" <<'X'
extern "C" int call_and_catch(void (*f)()) { try { f(); } catch (...) { return 1; } return 0; }
X
cat > "$d/main.cpp" <<'X'
#include <cstdio>
#include <exception>
#include <stdexcept>
extern "C" int call_and_catch(void (*f)());
static void thrower() { throw std::runtime_error("from the program"); }
int main() { const int caught = call_and_catch(thrower); std::printf("%d %d\n", caught, std::uncaught_exceptions()); }
X
for mode in static shared; do
  extra=(); [ $mode = shared ] && extra=("$runtime")
  "$d/static-cxx" -shared -fPIC "$d/lib.cpp" -o "$d/liblib.so" "${extra[@]}" -Wl,--exclude-libs,libstdc++.a:libsupc++.a
  "$d/static-cxx" "$d/main.cpp" -o "$d/main" -L"$d" -llib -Wl,-rpath,"$d" "${extra[@]}"
  got=$("$d/main")
  echo "$mode runtime: caught, uncaught_exceptions() after: $got"
  case $mode:$got in
    static:"1 1") ;;  # the problem, reproduced
    static:"1 0") echo "note: two static runtimes did not drift here" ;;
    shared:"1 0") ;;
    *) fail "$mode runtime: expected '1 0' (or '1 1' with two static runtimes), got '$got'" ;;
  esac
done
echo "OK"

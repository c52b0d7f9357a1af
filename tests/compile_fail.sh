#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# compile_fail.sh EXPECTED DEVICE COMPILER... : compiling a use of depot::runtime<DEVICE>
# must fail, and the compiler's message must contain EXPECTED.
expected=$1 device=$2
shift 2
src=$(mktemp --suffix=.cpp) || exit 2
trap 'rm -f "$src"' EXIT
printf '#include <depot/hal/runtime.hpp>\nint main() { return depot::runtime<%s>::device_count(); }\n' "$device" > "$src"
if out=$("$@" -fsyntax-only "$src" 2>&1); then
  echo "compile_fail: using $device compiled, but this build lacks that backend"; exit 1
fi
case $out in
  *"$expected"*) echo "compile_fail: refused with the expected message"; exit 0 ;;
  *) echo "compile_fail: refused, but without '$expected':"; echo "$out" | head -20; exit 1 ;;
esac

#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# compile_fail_source.sh EXPECTED SOURCE COMPILER... : compiling the C++ text SOURCE must
# fail, and the compiler's message must contain EXPECTED (a static_assert's text, say).
expected=$1 source=$2
shift 2
src=$(mktemp --suffix=.cpp) || exit 2
trap 'rm -f "$src"' EXIT
printf '%s\n' "$source" > "$src"
if out=$("$@" -fsyntax-only "$src" 2>&1); then
  echo "compile_fail_source: compiled, but it must not:"; cat "$src"; exit 1
fi
case $out in
  *"$expected"*) echo "compile_fail_source: refused with the expected message"; exit 0 ;;
  *) echo "compile_fail_source: refused, but without '$expected':"; echo "$out" | head -20; exit 1 ;;
esac

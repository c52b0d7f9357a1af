#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/consumer/check.sh BUILDDIR: installs depot from BUILDDIR into a temporary prefix and
# builds and runs a consumer through pkg-config, CMake find_package, and as a meson subproject.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
source "$root/tools/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

meson configure "$build" --prefix="$prefix" >/dev/null
meson install -C "$build" --quiet >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libdepot.so' | head -n 1)")
export LD_LIBRARY_PATH=$libdir

echo "consumer: pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
# shellcheck disable=SC2046
g++ -std=c++20 "$here/consumer.cpp" -o "$tmp/pc" $(pkg-config --cflags --libs depot)
"$tmp/pc"

echo "consumer: CMake find_package(depot)"
cmake -S "$here" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
"$tmp/cmake/consumer"

echo "consumer: meson subproject"
mkdir -p "$tmp/sub/subprojects"
cp "$here/meson.build" "$here/consumer.cpp" "$tmp/sub/"
ln -s "$root" "$tmp/sub/subprojects/depot"
meson setup "$tmp/sub/b" "$tmp/sub" -Ddepot:tests=false -Ddepot:bench=false >/dev/null
meson compile -C "$tmp/sub/b" >/dev/null
"$tmp/sub/b/consumer"
meson configure "$build" --prefix=/usr/local >/dev/null
echo "consumer: all three ways work"

# SPDX-License-Identifier: Apache-2.0
# Sourced by tools/test, tools/bench and tools/gpu-check.

# meson: Debian's, or the Python module where only that exists (the GPU machine).
if command -v meson >/dev/null 2>&1; then
  meson() { command meson "$@"; }
else
  meson() { python3 -m mesonbuild.mesonmain "$@"; }
fi

# configure DIR [meson options...]: sets DIR up, or reconfigures it if it exists.
configure() {
  local dir=$1
  shift
  if [ -f "$dir/meson-private/coredata.dat" ]; then
    meson setup --reconfigure "$dir" "$@"
  else
    rm -rf "$dir"
    meson setup "$dir" "$@"
  fi
}

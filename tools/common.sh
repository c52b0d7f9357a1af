# SPDX-License-Identifier: Apache-2.0
# Sourced by tools/test, tools/bench and tools/gpu-check.

# meson: Debian's, or the Python module where only that exists (the GPU machine). Decided
# at each call, not when this file is sourced: on a fresh machine the bootstrap installs
# Debian's meson after that, and the first python3 on PATH (pyenv, say) may lack the module.
meson() {
  if command -v meson >/dev/null 2>&1; then
    command meson "$@"
  else
    python3 -m mesonbuild.mesonmain "$@"
  fi
}

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

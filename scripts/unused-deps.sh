#!/usr/bin/env bash
# No crate declares a dependency it does not use: cargo-machete (installed
# into .cache/machete the first time, a minute or two). scripts/test.sh
# runs it. --install-only: install cargo-machete if it is missing, and stop
# there.
set -euo pipefail
cd "$(dirname "$0")/.."
machete_version=0.9.2
root=$PWD/.cache/machete
export PATH=$root/bin:$PATH
if ! grep -qF "$machete_version" <<<"$(cargo-machete --version 2>/dev/null)"; then
  echo "installing cargo-machete $machete_version into .cache/machete (once)"
  build=$PWD/.cache/machete-build
  CARGO_TARGET_DIR=$build cargo install cargo-machete --locked \
    --version "$machete_version" --root "$root" --quiet
  rm -rf "$build"
fi
[ "${1:-}" = --install-only ] && exit 0
cargo-machete

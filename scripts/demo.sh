#!/usr/bin/env bash
# The main job: start an embedded local cluster (a coordinator and two
# workers in this process, real QUIC with throw-away mutual-TLS
# certificates on loopback), load the bundled small CNN split over the two
# workers (conv1..pool2 on node-a, the rest on node-b), run one request on
# seeded inputs, print the plan and per-subgraph performance counters, and
# write the output to out/. Extra arguments go to `tessera run`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need-protoc.sh
cargo build --release --quiet -p tessera-cli --bin tessera
./target/release/tessera run examples/models/small_cnn.onnx \
  --devices HETERO:node-a/CPU,node-b/CPU --affinity examples/small_cnn_affinity.json \
  --random --seed 1 --perf-counts --output-dir out "$@"

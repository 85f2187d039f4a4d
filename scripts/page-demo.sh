#!/usr/bin/env bash
# The cluster page on a local cluster of real processes: a coordinator and
# three workers on loopback (mutual TLS; certificates made in
# out/page-demo), PP-OCRv4's rec model cut over node-a and node-b by their
# memory limits, and SmolLM2 (4-bit) on node-c for the playground where
# scripts/fetch-llm.sh fetched it. Opens
# http://127.0.0.1:${PORT:-8000}/ in a browser where there is one (and
# prints the address). Ctrl-C stops everything. BIN_DIR=target/debug uses
# binaries built already (the tests' debug build) instead of a release
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need-protoc.sh
./scripts/fetch-test-models.sh >/dev/null
if [ -n "${BIN_DIR:-}" ]; then
  bin=$(cd "$BIN_DIR" && pwd)
else
  cargo build --release --quiet -p tessera-cli --bins
  bin=$PWD/target/release
fi
dir=$PWD/out/page-demo
port=${PORT:-8000}
quic=${QUIC_PORT:-7431}
models=$PWD/.cache/models
mkdir -p "$dir"
"$bin/tessera" certs init --dir "$dir/certs" --cluster demo \
  --nodes coordinator,node-a,node-b,node-c,client >/dev/null
{
  cat <<EOF
cluster = "demo"
listen = "127.0.0.1:$quic"
certs = "$dir/certs"
http_listen = "127.0.0.1:$port"

[models.rec]
path = "$models/ch_PP-OCRv4_rec_infer.onnx"
devices = "HETERO:node-a/CPU,node-b/CPU"
shapes = { x = [1, 3, 48, 320] }
EOF
  if [ -d "$models/smollm2-135m-instruct-q4" ]; then
    cat <<EOF

[models.smollm2]
path = "$models/smollm2-135m-instruct-q4"
devices = "HETERO:node-c/CPU"
context = 512
max_sequences = 2
EOF
  fi
} > "$dir/cluster.toml"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT INT TERM
RUST_LOG=${RUST_LOG:-info} "$bin/coordinator" --config "$dir/cluster.toml" > "$dir/coordinator.log" 2>&1 &
pids+=($!)
sleep 1
# node-a and node-b offer less memory than rec needs: the planner cuts it
# into a stage on each.
for node in node-a node-b node-c; do
  limit=()
  [ "$node" = node-c ] || limit=(--memory-limit "CPU=${MEMORY_LIMIT:-8MiB}")
  RUST_LOG=${RUST_LOG:-info} "$bin/worker" --devices CPU --name "$node" --coordinator "127.0.0.1:$quic" \
    --certs "$dir/certs" --cluster demo --threads 1 "${limit[@]}" \
    --cache-dir "$dir/cache-$node" > "$dir/$node.log" 2>&1 &
  pids+=($!)
done
url="http://127.0.0.1:$port/"
echo "waiting for the models to deploy (logs in $dir)..."
for _ in $(seq 600); do
  curl -sf -o /dev/null "${url}v2/health/ready" && break
  sleep 0.5
done
echo "the cluster page: $url"
if command -v xdg-open >/dev/null && [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  xdg-open "$url" >/dev/null 2>&1 || true
fi
wait "${pids[0]}"

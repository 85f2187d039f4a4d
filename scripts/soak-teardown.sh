#!/usr/bin/env bash
# The teardown soak: start–run–stop cycles that end the way a user's
# script ends them, counted for crashes (a process killed by a signal) and
# non-zero exits, on a machine kept busy by two spinning processes.
#
#   1. `tessera run MODEL --workers 2 --worker-devices GPU,CPU --random`:
#      an embedded cluster whose workers serve the GPU (lavapipe where no
#      GPU is present) and the CPU, one request, then the process exits.
#      The models rotate over the corpus's models that run mostly on the
#      GPU (light_densenet121, light_squeezenet, light_shufflenet,
#      light_inception_v1, PP-OCRv4 cls, magika).
#   2. Worker processes with GPU,CPU under SIGTERM: a coordinator and two
#      `worker --devices GPU,CPU` processes; each cycle loads a model split
#      over both, runs it, then stops one worker with SIGTERM (its exit
#      status must be 0) and starts it again.
#
# A crashing process prints every thread's backtrace (gdb; the binaries
# install the crash report), which this script shows whole.
#
# Usage: scripts/soak-teardown.sh [--cycles N] [--stops N] [--models a,b]
#                                 [--debug] [--quiet-machine]
#   --cycles N      embedded-cluster cycles (default 200)
#   --stops N       SIGTERM cycles of GPU workers (default cycles / 10)
#   --models a,b    model files under .cache/models (default: the list above)
#   --debug         the debug binaries `cargo test` built (default: release)
#   --bin-dir DIR   the binaries in DIR (built already)
#   --quiet-machine no busy processes beside the cycles
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=200
stops=
profile=release
busy=2
models=light_densenet121.onnx,light_squeezenet.onnx,light_shufflenet.onnx,light_inception_v1.onnx,ch_ppocr_mobile_v2.0_cls_infer.onnx,magika_standard_v3_3.onnx
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) cycles=$2; shift 2 ;;
    --stops) stops=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --quiet-machine) busy=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
stops=${stops:-$(( (cycles + 9) / 10 ))}
dir=${TESSERA_MODELS_DIR:-.cache/models}
bin=${bin_dir:-target/$profile}
if [ -z "${bin_dir:-}" ] && [ "$profile" = release ]; then
  cargo build --release --quiet -p tessera-cli --bins
fi
for b in tessera worker coordinator; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: build it first (cargo build${profile/debug/})" >&2; exit 2; }
done
IFS=, read -r -a model_list <<<"$models"
for m in "${model_list[@]}"; do
  [ -f "$dir/$m" ] || { echo "no $dir/$m: run scripts/fetch-test-models.sh" >&2; exit 2; }
done

work=$(mktemp -d /tmp/tessera-soak.XXXXXX)
cleanup() {
  # The busy loops, the coordinator and the workers still running.
  local running
  running=$(jobs -p)
  [ -n "$running" ] && kill $running 2>/dev/null
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 "$busy"); do
  ( while :; do :; done ) &
done

crashes=0
failures=0
# One finished process: its exit status $1, its log $2, what it was $3.
judge() {
  local status=$1 log=$2 what=$3
  if [ "$status" -eq 0 ]; then
    return 0
  fi
  if [ "$status" -gt 128 ]; then
    crashes=$((crashes + 1))
    echo "CRASH (signal $((status - 128))) in $what:"
    if grep -q "tessera: fatal signal" "$log"; then
      sed -n '/tessera: fatal signal/,$p' "$log"
    else
      tail -n 30 "$log"
    fi
  else
    failures=$((failures + 1))
    echo "EXIT $status in $what:"
    tail -n 8 "$log"
  fi
}

# 1. Embedded GPU,CPU clusters.
started=$(date +%s)
for i in $(seq 1 "$cycles"); do
  model=${model_list[$(( (i - 1) % ${#model_list[@]} ))]}
  log=$work/run-$i.log
  set +e
  "$bin/tessera" run "$dir/$model" --workers 2 --worker-devices GPU,CPU --random \
    --deadline-ms 600000 --output-dir "$work/out" >"$log" 2>&1
  status=$?
  set -e
  judge "$status" "$log" "cycle $i ($model)"
  [ "$status" -eq 0 ] && rm -f "$log"
  if [ $((i % 10)) -eq 0 ] || [ "$i" -eq "$cycles" ]; then
    echo "[$i/$cycles] embedded GPU,CPU cycles: $crashes crashes, $failures non-zero exits ($(( $(date +%s) - started )) s)"
  fi
done

# 2. GPU,CPU worker processes stopped with SIGTERM.
if [ "$stops" -gt 0 ]; then
  certs=$work/certs
  "$bin/tessera" certs init --dir "$certs" --cluster soak --nodes coordinator,node-a,node-b,client >/dev/null
  cat >"$work/cluster.toml" <<EOF
cluster = "soak"
listen = "127.0.0.1:0"
certs = "$certs"
heartbeat_ms = 200
worker_timeout_ms = 1500
request_deadline_ms = 600000
EOF
  "$bin/coordinator" --config "$work/cluster.toml" >"$work/coordinator.out" 2>"$work/coordinator.log" &
  for _ in $(seq 1 300); do grep -q "listening on" "$work/coordinator.out" && break; sleep 0.1; done
  addr=$(sed -n '/^listening on /{s///p;q}' "$work/coordinator.out")
  [ -n "$addr" ] || { echo "the coordinator did not start:"; cat "$work/coordinator.log"; exit 1; }
  declare -A worker_pid worker_log
  start_worker() { # name, start number
    worker_log[$1]=$work/$1-$2.log
    "$bin/worker" --devices GPU,CPU --name "$1" --coordinator "$addr" --certs "$certs" \
      --cluster soak >"$work/$1.out" 2>"${worker_log[$1]}" &
    worker_pid[$1]=$!
    for _ in $(seq 1 600); do
      grep -q "registered as" "$work/$1.out" 2>/dev/null && return 0
      kill -0 "${worker_pid[$1]}" 2>/dev/null || break
      sleep 0.1
    done
    echo "worker $1 did not register"; tail -n 20 "${worker_log[$1]}"; return 1
  }
  start_worker node-a 0
  start_worker node-b 0
  remote=(--coordinator "$addr" --certs "$certs" --cluster soak)
  for i in $(seq 1 "$stops"); do
    model=${model_list[$(( (i - 1) % ${#model_list[@]} ))]}
    log=$work/stop-run-$i.log
    set +e
    "$bin/tessera" run "$dir/$model" "${remote[@]}" --random --output-dir "$work/out" \
      --devices HETERO:node-a/GPU,node-b/GPU,node-a/CPU,node-b/CPU >"$log" 2>&1
    status=$?
    set -e
    judge "$status" "$log" "SIGTERM cycle $i: the run of $model"
    victim=node-a
    [ $((i % 2)) -eq 0 ] && victim=node-b
    kill -TERM "${worker_pid[$victim]}"
    set +e
    wait "${worker_pid[$victim]}"
    status=$?
    set -e
    judge "$status" "${worker_log[$victim]}" "SIGTERM cycle $i: worker $victim stopping"
    : >"$work/$victim.out"
    start_worker "$victim" "$i"
  done
  echo "GPU,CPU workers stopped with SIGTERM: $stops cycles"
fi

echo "teardown soak: $cycles embedded GPU,CPU cycles and $stops SIGTERM stops of GPU,CPU workers" \
  "with $busy busy processes beside them: $crashes crashes, $failures non-zero exits"
if [ "$crashes" -ne 0 ] || [ "$failures" -ne 0 ]; then
  echo "logs: $work"
  exit 1
fi
rm -rf "$work"

#!/usr/bin/env bash
# The fault drill across containers. Builds the image, brings up the
# compose cluster (etcd, two HA coordinators and three workers, each its
# own container and address), then runs a steady load of concurrent PP-OCRv4 rec requests
# (rapidocr-onnxruntime==1.4.4), every answer checked against onnxruntime,
# while it
#   1. kills node-b (docker kill), then starts it again (it rejoins);
#      stops node-a (docker stop: SIGTERM, it drains: its stage moves to
#      the others while it finishes what it holds, then it exits), then
#      starts it again;
#   2. cuts node-c off the network (docker network disconnect), then
#      reconnects it;
#   3. kills the leading coordinator (docker kill: SIGKILL): the load goes
#      on without it; the standby takes the lead when the leader's etcd
#      lease runs out, serves the network from the state in etcd and adopts
#      what the workers run, and the workers follow it by themselves (the
#      time without a leader is printed); then starts the killed one again,
#      which stands by.
# Then node-c's GPU (Mesa's lavapipe inside the image) runs rec, checked
# against onnxruntime within 1e-3.
# Prints requests sent / succeeded / failed with a clear error / lost and
# the recovery times; fails unless lost = 0 and every success is right.
# The cluster is torn down at the end, even on failure.
#
# Usage: scripts/fault-drill.sh [--debug]   (--debug: the debug binaries
# that `cargo test` built, as in CI; default: a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
[ "${1:-}" = "--debug" ] && profile=debug
compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose -p tessera "$@"
  else
    docker-compose -p tessera "$@"
  fi
}
work=$(mktemp -d /tmp/tessera-drill.XXXXXX)
teardown() {
  status=$?
  compose logs --no-color >"$work/compose.log" 2>&1 || true
  compose down -v --remove-orphans -t 1 >/dev/null 2>&1 || true
  if [ "$status" -ne 0 ]; then
    echo "fault drill FAILED; the cluster's last log lines ($work/compose.log):"
    tail -n 40 "$work/compose.log" || true
  fi
}
trap teardown EXIT
say() { echo "[drill $(date +%T)] $*"; }

./scripts/docker-build.sh ${1:-}
./scripts/fetch-test-models.sh >/dev/null
model=${TESSERA_MODELS_DIR:-.cache/models}/ch_PP-OCRv4_rec_infer.onnx
tessera=target/$profile/tessera
remote=(--coordinator 127.0.0.1:7400,127.0.0.1:7401 --certs certs --cluster tessera)
# The leading coordinator's container name (coordinator or coordinator-b).
leader_of() {
  "$tessera" cluster "${remote[@]}" 2>/dev/null | sed -n 's/^coordinator \([a-z-]*\):7400 (leader).*/\1/p'
}

compose down -v --remove-orphans -t 1 >/dev/null 2>&1 || true
say "docker compose up"
compose up -d
for i in $(seq 1 120); do
  if "$tessera" cluster "${remote[@]}" >"$work/cluster.txt" 2>/dev/null &&
    grep -q "^3 workers" "$work/cluster.txt" && grep -q "(standby)" "$work/cluster.txt"; then
    break
  fi
  [ "$i" -eq 120 ] && { say "the cluster did not come up within 60 s"; exit 1; }
  sleep 0.5
done
say "healthy:"; cat "$work/cluster.txt"
# The leading coordinator's HTTP listener (KServe v2), published on the
# loopback: 8000 for `coordinator`, 8002 for `coordinator-b`.
leader=$(leader_of)
http=8000; [ "$leader" = coordinator-b ] && http=8002
# The metrics are read whole before they are searched: under pipefail,
# `curl | grep -q` fails when grep stops reading before curl has written.
if ! curl -fsS "http://127.0.0.1:$http/v2/health/live" >/dev/null ||
  ! metrics=$(curl -fsS "http://127.0.0.1:$http/metrics") ||
  ! grep -q '^tessera_worker_up{worker="node-a"} 1' <<<"$metrics"; then
  say "the leader's ($leader) HTTP listener does not answer on 127.0.0.1:$http"; exit 1
fi
say "HTTP: /v2/health/live and /metrics answer ($leader leads)"
# node-a's and node-b's own front doors (published as 8010 and 8020).
for port in 8010 8020; do
  for i in $(seq 1 40); do
    curl -fsS "http://127.0.0.1:$port/v2/health/live" >/dev/null 2>&1 && break
    [ "$i" -eq 40 ] && { say "the worker front door on 127.0.0.1:$port does not answer"; exit 1; }
    sleep 0.5
  done
done
say "the front doors of node-a and node-b answer"

# Seeded inputs, and onnxruntime's answers to them.
cases=$work/cases
"$tessera" soak "$model" --make-cases 4 --cases "$cases" >/dev/null
runs=()
for k in 0 1 2 3; do
  [ "$k" -gt 0 ] && runs+=(--)
  for f in "$cases"/case${k}_*.npy; do
    name=$(basename "$f" .npy); runs+=("${name#case${k}_}=$f")
  done
done
python3 tests/python/ort_run.py "$model" "$cases/expected" "${runs[@]}"

# The load: four requests in flight, one stage of the model per worker.
"$tessera" soak "$model" "${remote[@]}" --devices HETERO:node-a/CPU,node-b/CPU,node-c/CPU \
  --spread node-a,node-b,node-c --cases "$cases" --concurrency 4 --seconds 110 \
  --deadline-ms 30000 --events "$work/events.jsonl" >"$work/soak.out" 2>"$work/soak.err" &
soak=$!
for i in $(seq 1 240); do
  grep -q "^soak:" "$work/soak.out" 2>/dev/null && break
  kill -0 "$soak" 2>/dev/null || { cat "$work/soak.err"; exit 1; }
  [ "$i" -eq 240 ] && { say "the network did not load within 120 s"; exit 1; }
  sleep 0.5
done
say "$(head -1 "$work/soak.out")"
mark() { echo "$1 $(date +%s%3N)" >>"$work/marks"; say "$1"; }
sleep 10
mark kill-node-b
docker kill tessera-node-b >/dev/null
sleep 10
mark start-node-b
docker start tessera-node-b >/dev/null
sleep 10
# SIGTERM (docker stop): the worker drains (the coordinator moves its stage
# to the others while it finishes what it holds), then exits.
mark stop-node-a
docker stop -t 10 tessera-node-a >/dev/null
sleep 10
mark start-node-a
docker start tessera-node-a >/dev/null
sleep 10
mark disconnect-node-c
docker network disconnect tessera tessera-node-c
sleep 10
mark reconnect-node-c
docker network connect tessera tessera-node-c
sleep 10
leader=$(leader_of)
mark kill-leader
killed=$(date +%s%3N)
docker kill "tessera-$leader" >/dev/null
for i in $(seq 1 300); do
  now=$(leader_of) || true
  [ -n "$now" ] && [ "$now" != "$leader" ] && break
  [ "$i" -eq 300 ] && { say "no coordinator took the lead within 30 s"; exit 1; }
  sleep 0.1
done
led=$(date +%s%3N)
say "$now leads: the cluster had no leader for $(( led - killed )) ms after $leader's kill -9"
sleep 5
docker start "tessera-$leader" >/dev/null
say "$leader started again (it stands by)"
set +e
wait "$soak"
soak_status=$?
set -e
cat "$work/soak.out"
python3 - "$work/events.jsonl" "$work/marks" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
marks = [(n, int(t)) for n, t in (line.split() for line in open(sys.argv[2]))]
ends = [t for _, t in marks[1:]] + [max(e["unix_ms"] for e in events) + 1]
for (name, t), end in zip(marks, ends):
    phase = [e for e in events if t <= e["unix_ms"] < end]
    count = lambda o: sum(e["outcome"] == o for e in phase)
    line = f"{name}: {len(phase)} answered, {count('ok')} ok, {count('failed')} failed, {count('lost')} lost, {count('wrong')} wrong, {sum(e['attempts'] > 1 for e in phase)} retried"
    if name in ("kill-node-b", "stop-node-a", "disconnect-node-c"):
        before = {e["deployment"] for e in events if e["unix_ms"] < t and e["outcome"] == "ok"}
        new = [e["unix_ms"] for e in phase if e["outcome"] == "ok" and e["deployment"] not in before]
        line += f"; first success on the new plan {(min(new) - t) / 1e3:.2f} s after" if new else "; no success on a new plan"
    if name == "kill-leader":
        reloaded = [e["unix_ms"] for e in phase if e["outcome"] == "ok" and e["generation"] > 0]
        line += f"; the client had to load again: first success {(min(reloaded) - t) / 1e3:.2f} s after" if reloaded else "; served throughout, nothing loaded again"
        oks = sorted(e["unix_ms"] for e in phase if e["outcome"] == "ok")
        gap = max((b - a for a, b in zip(oks, oks[1:])), default=0)
        line += f"; longest gap between two answers {gap / 1e3:.2f} s"
    print(line)
PY
[ "$soak_status" -eq 0 ] || exit "$soak_status"

# node-c's GPU, on Mesa's lavapipe inside the image: rec on node-c/GPU with
# what the GPU plugin lacks on node-c/CPU, on case 0's inputs. The answer
# must match onnxruntime's within 1e-3 and the plan must put nodes on the
# GPU.
gpu_inputs=()
for f in "$cases"/case0_*.npy; do
  name=$(basename "$f" .npy); gpu_inputs+=(--input "${name#case0_}=$f")
done
"$tessera" run "$model" "${remote[@]}" --devices HETERO:node-c/GPU,node-c/CPU "${gpu_inputs[@]}" \
  --output-dir "$work/gpu" >"$work/gpu.txt"
python3 - "$work/gpu.txt" "$work/gpu" "$cases/expected/out0.npy" <<'PY'
import glob, re, sys
import numpy as np
plan, out_dir, expected = sys.argv[1:]
nodes = {}
for m in re.finditer(r"^subgraph\d+ on (\S+): (\d+) nodes", open(plan).read(), re.M):
    nodes[m.group(1)] = nodes.get(m.group(1), 0) + int(m.group(2))
outs = glob.glob(f"{out_dir}/*.npy")
assert len(outs) == 1, outs
got, want = np.load(outs[0]), np.load(expected)
diff = float(np.abs(got - want).max())
print(f"GPU worker (lavapipe in the image): {nodes.get('node-c/GPU', 0)} nodes on node-c/GPU, "
      f"{nodes.get('node-c/CPU', 0)} on node-c/CPU; max abs difference from onnxruntime {diff:.2e}")
assert nodes.get("node-c/GPU", 0) > 0, f"no node on the GPU: {nodes}"
assert diff <= 1e-3, f"the GPU worker's answer differs from onnxruntime's by {diff}"
PY

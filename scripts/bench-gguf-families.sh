#!/usr/bin/env bash
# Tessera and llama.cpp decoding GGUFs of the families besides llama, at
# real shapes (seeded random weights, every matrix Q4_K where its rows are
# whole 256-weight blocks, else llama-quantize's fallback Q5_0:
# scripts/llm/random_gguf.py --like qwen2.5-0.5b | gemma-2-2b | moe-1b):
# decode tokens/s on one thread, llama-bench tg64 against `tessera
# generate` (its "tokens/s after it"), alternating, best of 3, in one run
# (scripts/llm/bench_gguf_1b.py's decode). One table.
#
#   scripts/bench-gguf-families.sh [--runs 3] [--like qwen2.5-0.5b,gemma-2-2b,moe-1b]
#
# The files are written once into .cache/models/ (0.3-1.5 GB each, a few
# seconds). BIN_DIR=DIR uses Tessera's binaries there (tessera,
# coordinator, worker) instead of a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
likes=qwen2.5-0.5b,gemma-2-2b,moe-1b
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --like) likes=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--like A,B,...]" >&2; exit 2 ;;
  esac
done
python3 -c "import gguf, numpy" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check gguf==0.19.0 numpy
rows=()
for like in ${likes//,/ }; do
  file=.cache/models/random-$like-q4_k.gguf
  force=()
  if [ -f "$file" ] && [ scripts/llm/random_gguf.py -nt "$file" ]; then force=(--force); fi
  if [ ! -f "$file" ] || [ ${#force[@]} -gt 0 ]; then
    python3 scripts/llm/random_gguf.py --like "$like" --type Q4_K --seed 0 --out "$file" "${force[@]}"
  fi
  echo "== $like"
  out=$(GGUF=$file scripts/bench-gguf-1b.sh --runs "$runs" --skip load,prompt,convert,servers)
  echo "$out" | grep -E "^  (llama|tessera)|decode tokens/s"
  rows+=("| $like ($(du -m "$file" | cut -f1) MB) |$(echo "$out" | grep "decode tokens/s" | cut -d'|' -f3-)")
done
echo
echo "| model (random Q4_K GGUF) | llama.cpp tokens/s | Tessera tokens/s | Tessera / llama.cpp |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"

#!/usr/bin/env bash
# A copy of an F32 (or F16) GGUF with every matrix in one type, made by
# llama.cpp's own llama-quantize, then checked with gguf.GGUFReader.
#
#   scripts/llm/quantize_gguf.sh IN.gguf OUT.gguf TYPE
#
# TYPE: F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K.
# llama-quantize runs with --pure: no K-quant mixtures, every matrix takes
# TYPE, the token embedding and the output head included (--pure alone
# does that; --token-embedding-type / --output-tensor-type are not needed,
# and would skip llama-quantize's fallback: it aborts on a tensor whose
# rows are not whole blocks of the type). 1-D tensors (norms, rope_freqs)
# and experts' routers (ffn_gate_inp) stay F32, as llama-quantize never
# quantizes them. Q3_K and Q4_K/Q5_K are
# its Q3_K_M and Q4_K_M/Q5_K_M file types, which --pure makes plain
# Q3_K/Q4_K/Q5_K. A matrix whose rows are not whole blocks of TYPE (256
# weights for the K-quants, 32 for the others) gets llama-quantize's
# fallback type (Q4_K -> Q5_0, ...): the check then fails and names it.
# llama-quantize is built on first use (scripts/llama-cpp.sh). Prints one
# line saying what was written.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 IN.gguf OUT.gguf TYPE" >&2; exit 2; }
in=$1 out=$2 type=$3
here=$(cd "$(dirname "$0")" && pwd)
case $type in
  F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q6_K) ftype=$type ;;
  Q3_K | Q4_K | Q5_K) ftype=${type}_M ;;
  *) echo "quantize_gguf.sh: unsupported type $type" >&2; exit 2 ;;
esac
[ -f "$in" ] || { echo "quantize_gguf.sh: no such file: $in" >&2; exit 1; }
bin=$("$here/../llama-cpp.sh" llama-quantize)
mkdir -p "$(dirname "$out")"
log=$(mktemp)
trap 'rm -f "$log" "$out.part"' EXIT
if ! "$bin/llama-quantize" --pure "$in" "$out.part" "$ftype" "${TESSERA_QUANTIZE_THREADS:-2}" >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "quantize_gguf.sh: llama-quantize $in $type failed" >&2
  exit 1
fi
python3 - "$out.part" "$type" <<'EOF'
import sys
import gguf

path, want = sys.argv[1], gguf.GGMLQuantizationType[sys.argv[2]]
wrong = []
for t in gguf.GGUFReader(path).tensors:
    # Routers stay F32: llama-quantize never quantizes ffn_gate_inp.
    dense = len(t.shape) < 2 or ".ffn_gate_inp" in t.name
    expect = gguf.GGMLQuantizationType.F32 if dense else want
    if t.tensor_type != expect:
        wrong.append(f"{t.name} {t.tensor_type.name}")
if wrong:
    sys.exit(f"quantize_gguf.sh: llama-quantize made other types than {want.name}: " + ", ".join(wrong))
EOF
mv "$out.part" "$out"
echo "wrote $out ($type, $(($(stat -c %s "$out") / 1000)) kB) from $in"

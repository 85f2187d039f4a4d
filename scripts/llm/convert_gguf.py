#!/usr/bin/env python3
"""Convert a llama-architecture GGUF file into an ONNX decoder folder.

The folder follows the Hugging Face Optimum / onnxruntime-genai layout:
model.onnx (+ model.onnx.data), config.json, genai_config.json,
tokenizer.json, tokenizer_config.json and special_tokens_map.json. Weights
are dequantized to float32 but where --q4 keeps them;
check the result with check_model.py (--gguf: against the GGUF itself).

--q4 also builds the graph from onnxruntime's fused operators (see
onnx_fused.py), stores the blocks' scales and minimums as the GGUF's
float16 (cast to float32 at load) and computes the logits of the last
position only: SmolLM2-135M runs ~1,100 nodes instead of ~2,500, 1.8x
faster on one thread.

--q4 keeps the linear weights of every type llama.cpp's common models use
as MatMulNBits (see gguf_blocks.py): Q4_0, Q4_1 and Q4_K 4-bit, Q5_0,
Q5_1, Q5_K, Q6_K and Q8_0 8-bit (a 5- or 6-bit value is exact in 8 bits),
minimums (Q4_1, Q5_1, the K-quants) as a small product of their own and a
K-quant's factors as its float16 times its small integers. Other types
(float16, bfloat16, the IQ and 2-/3-bit types) are dequantized to float32.

A GGUF with an output head of its own (output.weight, untied from the
embedding, as most llama models past ~1B) gets it as lm_head, a linear
layer kept quantized like the others.

--q4 keeps an 8-bit-able token embedding (Q8_0, Q6_K, Q5_0) 8-bit
too: its lookup gathers rows of bytes and scales, and a tied head is
MatMulNBits with 8 bits over the same bytes (30.6 MiB instead of 108 MiB; the folder 1.05x the GGUF's
bytes). onnxruntime 1.32 runs that head faster than float32 for one row
(5.3 vs 9.1 ms a token here) but slower for several (16.1 vs 11.2 ms for
4 rows; a prompt runs it for its last position only).

    convert_gguf.py MODEL.gguf OUT_DIR          # the GGUF's own weights
    convert_gguf.py MODEL.gguf OUT_DIR --tiny   # 2-layer random-weight model
                                                # with the GGUF's tokenizer
    convert_gguf.py MODEL.gguf OUT_DIR --q4     # quantized linear weights
                                                # and embedding kept as
                                                # they are
    convert_gguf.py MODEL.gguf OUT_DIR --q4 --f32-embedding
                                                # the embedding in float32
"""

import argparse
import sys
import time
from pathlib import Path

import gguf
import onnx

from hf_files import Vocabulary, vocabulary_from_gguf, write_support_files
from llama_config import LlamaConfig, config_from_gguf, tiny_config
from llama_weights import random_weights, weights_from_gguf
from onnx_graph import NBITS_ACCURACY, build_model

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "gguf", type=Path, help="llama GGUF file (weights, hyperparameters, tokenizer)"
    )
    parser.add_argument("out_dir", type=Path, help="output folder, created if missing")
    parser.add_argument(
        "--tiny", action="store_true", help="2-layer model with seeded random weights"
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed of --tiny (default 7)")
    parser.add_argument(
        "--q4",
        action="store_true",
        help="keep quantized linear weights quantized (onnxruntime's MatMulNBits)",
    )
    parser.add_argument(
        "--float-activations",
        action="store_true",
        help="MatMulNBits in float32 (accuracy level 0), not int8: slower, exact up to "
        "rounding (for checks)",
    )
    parser.add_argument(
        "--f32-embedding",
        action="store_true",
        help="with --q4: the token embedding in float32, not kept 8-bit (a float32 head is "
        "faster for decode batches of several rows)",
    )
    return parser.parse_args()


def check_merges(vocab: Vocabulary) -> None:
    """tokenizer.json stores merges as "left right"; neither side may hold a space."""
    bad = [merge for merge in vocab.merges if merge.count(" ") != 1]
    if bad:
        raise ValueError(f"{len(bad)} merges are not 'left right' pairs, e.g. {bad[0]!r}")


def save_model(model: onnx.ModelProto, out_dir: Path, external_data: bool) -> None:
    """Write model.onnx, its weights in model.onnx.data when `external_data`."""
    path = out_dir / MODEL_FILE
    (out_dir / DATA_FILE).unlink(missing_ok=True)
    if external_data:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=DATA_FILE,
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, path)
    onnx.checker.check_model(str(path))


def convert(
    gguf_path: Path, out_dir: Path, tiny: bool, seed: int, q4: bool, q8_embedding: bool,
    float_activations: bool = False,
) -> LlamaConfig:
    reader = gguf.GGUFReader(gguf_path)
    config = config_from_gguf(reader)
    vocab = vocabulary_from_gguf(reader)
    check_merges(vocab)
    if tiny:
        config = tiny_config(config)
        weights = random_weights(config, seed)
    else:
        weights = weights_from_gguf(reader, config, keep_q4=q4, keep_q8_embedding=q8_embedding)
    out_dir.mkdir(parents=True, exist_ok=True)
    # genai_config.json, written last, marks a finished folder (fetch-llm.sh).
    (out_dir / "genai_config.json").unlink(missing_ok=True)
    accuracy = 0 if float_activations else NBITS_ACCURACY
    model = build_model(config, weights, fused=q4, nbits_accuracy=accuracy)
    save_model(model, out_dir, external_data=not tiny)
    write_support_files(out_dir, config, vocab)
    return config


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    config = convert(
        args.gguf, args.out_dir, args.tiny, args.seed, args.q4, args.q4 and not args.f32_embedding,
        args.float_activations,
    )
    elapsed = time.perf_counter() - started
    size = sum(f.stat().st_size for f in args.out_dir.iterdir() if f.is_file())
    print(
        f"{args.out_dir}: {config.num_layers} layers, hidden {config.hidden_size}, "
        f"{size / 1e6:.1f} MB in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

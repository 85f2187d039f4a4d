#!/usr/bin/env python3
"""Write a GGUF file's copy with its linear weights in another quantization.

    requantize_gguf.py IN.gguf OUT.gguf --type Q8_0|Q4_0|Q4_1|Q5_0|Q5_1|Q4_K|Q5_K|Q6_K

Every metadata field and every other tensor is copied as it is; each linear
weight (attention q/k/v/output, feed-forward gate/up/down) is dequantized
and quantized again to --type: the legacy types by the gguf library
(llama.cpp's own reference rounding, in numpy), the K-quants by
`k_quants` (the gguf library reads them but does not write them). A
K-quant needs rows of whole 256-weight super-blocks; a weight whose rows
are not (SmolLM2's 576 inputs) gets llama.cpp's fallback type, as
llama-quantize does: Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K. The
tests make GGUFs of the types that llama.cpp's common models use from the
one GGUF they fetch, so that the converter's reading of each type is
checked against the GGUF itself.
"""

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

import k_quants

Q = gguf.GGMLQuantizationType
LINEAR = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down.")
TYPES = {name: Q[name] for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")}
# The K-quants' writers, and the type llama-quantize falls back to where a
# row is not whole super-blocks.
K_QUANTS = {Q.Q4_K: (k_quants.q4_k, Q.Q5_0), Q.Q5_K: (k_quants.q5_k, Q.Q5_1),
            Q.Q6_K: (k_quants.q6_k, Q.Q8_0)}


def quantize(values: np.ndarray, qtype: gguf.GGMLQuantizationType):
    """`values` ([out, in] float32) in `qtype`, or its fallback: (bytes, type)."""
    if qtype in K_QUANTS:
        write, fallback = K_QUANTS[qtype]
        if values.shape[-1] % k_quants.SUPER == 0:
            return write(values), qtype
        qtype = fallback
    return gguf.quants.quantize(values, qtype), qtype


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        # The writer writes the architecture and the GGUF.* fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def untied_head(embedding: np.ndarray) -> np.ndarray:
    """An output head for a tied model's copy: the embedding's rows, each
    scaled by its own factor in 0.5..1.5 (so that a converter reading the
    embedding where it should read the head gives other logits)."""
    factors = 1.0 + 0.5 * np.sin(np.arange(embedding.shape[0], dtype=np.float32))
    return (embedding * factors[:, None]).astype(np.float32)


def requantize(
    source: Path, target: Path, qtype: gguf.GGMLQuantizationType, overrides: dict[str, Q],
    head_type: Q | None = None,
) -> dict[str, int]:
    """Writes `target`; how many tensors it quantized again, by type.
    `overrides`: another type for the weights of some kinds (`attn_v`).
    `head_type`: also an untied output head (`output.weight`) of that type."""
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch)
    copy_metadata(reader, writer)
    changed = {}
    for tensor in reader.tensors:
        linear = tensor.name.startswith("blk.") and any(k in tensor.name for k in LINEAR)
        # blk.N.attn_v.weight: attn_v; token_embd.weight: token_embd.
        part = tensor.name.split(".")[2 if linear else 0]
        if linear or part in overrides:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            data, kind = quantize(values, overrides.get(part, qtype))
            writer.add_tensor(tensor.name, data, raw_dtype=kind)
            changed[kind.name] = changed.get(kind.name, 0) + 1
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        if tensor.name == "token_embd.weight" and head_type is not None:
            embedding = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            data, kind = quantize(untied_head(embedding), head_type)
            writer.add_tensor("output.weight", data, raw_dtype=kind)
            changed[kind.name] = changed.get(kind.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--type", choices=sorted(TYPES), required=True)
    parser.add_argument(
        "--type-of",
        action="append",
        default=[],
        metavar="KIND=TYPE",
        help="another type for one kind of weight, as llama.cpp's mixes do "
        "(Q4_K_M keeps attn_v and ffn_down in Q6_K), or for the token embedding: "
        "attn_v=Q8_0, token_embd=Q6_K",
    )
    parser.add_argument(
        "--untie",
        choices=sorted(TYPES),
        help="also write an output head of this type (output.weight: the embedding with "
        "each row scaled), as models with their own head have",
    )
    args = parser.parse_args()
    overrides = {}
    for item in args.type_of:
        kind, _, name = item.partition("=")
        kinds = [k.rstrip(".") for k in LINEAR] + ["token_embd"]
        if kind not in kinds or name not in TYPES:
            parser.error(f"--type-of {item}: want one of {kinds} '=' one of {sorted(TYPES)}")
        overrides[kind] = TYPES[name]
    head = TYPES[args.untie] if args.untie else None
    changed = requantize(args.source, args.target, TYPES[args.type], overrides, head)
    counts = ", ".join(f"{n} in {kind}" for kind, n in sorted(changed.items()))
    print(f"{args.target}: quantized again: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write a GGUF file's copy with its linear weights in another quantization.

    requantize_gguf.py IN.gguf OUT.gguf --type Q8_0|Q4_0|Q4_1

Every metadata field and every other tensor is copied as it is; each linear
weight (attention q/k/v/output, feed-forward gate/up/down) is dequantized
and quantized again to --type by the gguf library (llama.cpp's own
reference rounding, in numpy). The tests make GGUFs of the types that
llama.cpp's common models use from the one GGUF they fetch, so that the
converter's reading of each type is checked against the GGUF itself.
"""

import argparse
import sys
from pathlib import Path

import gguf

LINEAR = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down.")
TYPES = {
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
}


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        # The writer writes the architecture and the GGUF.* fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def requantize(source: Path, target: Path, qtype: gguf.GGMLQuantizationType) -> int:
    """Writes `target`; how many tensors it quantized again."""
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch)
    copy_metadata(reader, writer)
    changed = 0
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and any(k in tensor.name for k in LINEAR):
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
            changed += 1
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
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
    args = parser.parse_args()
    changed = requantize(args.source, args.target, TYPES[args.type])
    print(f"{args.target}: {changed} linear weights in {args.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

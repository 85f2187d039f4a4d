"""The graph pieces of weights kept quantized (`gguf_blocks`' forms):
products through onnxruntime's com.microsoft MatMulNBits, their block
factors stored as the GGUF stores them, and an 8-bit token embedding's
lookup (standard ops) and tied head (MatMulNBits over the same bytes).

Each function takes the `onnx_graph.GraphBuilder` it adds to.
"""

import numpy as np
from onnx import TensorProto

from gguf_blocks import BlockScales, Q4Weight, Q8Weight, Scales

MS_DOMAIN = "com.microsoft"


def scale_input(b, name: str, scales: Scales, transposed: bool = False) -> str:
    """Per-block factors [out, blocks] as a float32 tensor: flat ([out *
    blocks], MatMulNBits' scales) or transposed ([blocks, out], the right
    side of a product). Float16 values are stored as float16; a K-quant's
    as its float16 per super-block and small integer per block, multiplied
    by a Mul that onnxruntime (and Tessera's simplification) folds at load:
    the product is exact in float32, not in float16. Anything else (factors
    of mixed types stacked) is stored as float32."""
    if not isinstance(scales, BlockScales):
        values = np.ascontiguousarray(scales.T if transposed else scales.reshape(-1))
        half = values.astype(np.float16)
        if np.array_equal(half.astype(np.float32), values):
            return b.half_weight(name, values)
        return b.weight(name, values.astype(np.float32))
    out, blocks = scales.fine.shape
    supers = scales.coarse.shape[1]
    fine = b.weight(f"{name}.fine", scales.fine.reshape(out, supers, blocks // supers))
    fine = b.op("Cast", [fine], f"{name}/fine/Cast", to=TensorProto.FLOAT)
    coarse = b.half_weight(f"{name}.coarse", scales.coarse.reshape(out, supers, 1))
    product = b.op("Mul", [fine, coarse], f"{name}/Mul")
    if not transposed:
        return b.op("Reshape", [product, b.const([-1])], f"{name}/Reshape", output=name)
    matrix = b.op("Reshape", [product, b.const([out, blocks])], f"{name}/Reshape")
    return b.op("Transpose", [matrix], f"{name}/Transpose", output=name, perm=[1, 0])


def q4_linear(b, x: str, w: Q4Weight, name: str, prefix: str) -> str:
    """x @ W^T for a 4-bit W = q * scale + minimum (blocks of 32 inputs):
    MatMulNBits over q and the scales (zero point 0: onnxruntime's fast
    kernels take only integer zero points, and a minimum is not one), plus
    each block's sum of x times its minimum. Exact up to rounding.
    A Q4_0 W = (q - 8) * scale is MatMulNBits with zero point 8 alone."""
    out_dim, in_dim = w.shape
    blocks = in_dim // 32
    # Two 4-bit zero points a byte: 0 with minimums apart, 8 for Q4_0.
    point = 0x00 if w.minimums is not None else 0x88
    zero = np.full(out_dim * ((blocks + 1) // 2), point, dtype=np.uint8)
    inputs = [
        x,
        b.weight(name, w.blobs),
        scale_input(b, f"{name}.scales", w.scales),
        b.weight(f"{name}.zero_points", zero),
    ]
    scaled = b.op(
        "MatMulNBits", inputs, f"{prefix}/MatMulNBits", domain=MS_DOMAIN,
        K=in_dim, N=out_dim, bits=4, block_size=32, accuracy_level=b.nbits_accuracy,
    )
    return plus_minimums(b, x, scaled, w.minimums, 32, name, prefix)


def q8_linear(b, x: str, w: Q8Weight, name: str, prefix: str) -> str:
    """x @ W^T for an 8-bit W = (q - 128) * scale (+ minimum) in blocks of
    32 or 16 inputs: MatMulNBits with 8 bits, no zero points (onnxruntime's
    default for 8 bits is 128), plus the minimums' product where there are
    some (Q5_1, Q5_K)."""
    out_dim, in_dim = w.shape
    inputs = [x, b.weight(name, w.blobs), scale_input(b, f"{name}.scales", w.scales)]
    scaled = b.op(
        "MatMulNBits", inputs, f"{prefix}/MatMulNBits", domain=MS_DOMAIN,
        K=in_dim, N=out_dim, bits=8, block_size=w.block, accuracy_level=b.nbits_accuracy,
    )
    return plus_minimums(b, x, scaled, w.minimums, w.block, name, prefix)


def plus_minimums(
    b, x: str, scaled: str, minimums: Scales | None, block: int, name: str, prefix: str
) -> str:
    """`scaled` plus sum(x over each block) @ minimums^T, where there are some."""
    if minimums is None:
        return scaled
    sums = block_sums(b, x, minimums.shape[1], block)
    minimums_t = scale_input(b, f"{name}.minimums", minimums, transposed=True)
    shift = b.op("MatMul", [sums, minimums_t], f"{prefix}/minimums/MatMul")
    return b.op("Add", [scaled, shift], f"{prefix}/Add")


def block_sums(b, x: str, blocks: int, block: int) -> str:
    """x's sums over blocks of `block` along its last axis ([.., blocks]),
    made once per tensor (q, k and v share theirs, as do gate and up)."""
    name = f"{x}/block_sums_{block}"
    if b.made(name):
        return f"{name}/output_0"
    split = b.op("Reshape", [x, b.const([0, 0, blocks, block])], f"{name}/Reshape")
    return b.op("ReduceSum", [split, b.const([-1])], name, keepdims=0)


def q8_embedding(b, hidden: int, w: Q8Weight, name: str) -> tuple[str, str]:
    """An 8-bit embedding's rows for input_ids, dequantized ([B, S, H]),
    and its flat scales (the head's MatMulNBits takes them as they are:
    one float per block)."""
    p = "/model/embed_tokens"
    blobs = b.weight(name, w.blobs)
    scales = scale_input(b, f"{name}.scales", w.scales)
    table = b.op("Reshape", [scales, b.const([-1, hidden // w.block])], f"{p}/scales/Reshape")
    rows = b.op("Gather", [blobs, "input_ids"], f"{p}/Gather", axis=0)  # [B, S, blocks, block]
    values = b.op("Cast", [rows], f"{p}/Cast", to=TensorProto.FLOAT)
    centred = b.op("Sub", [values, b.const(128.0, np.float32)], f"{p}/Sub")
    row_scales = b.op("Gather", [table, "input_ids"], f"{p}/scales/Gather", axis=0)
    row_scales = b.op("Unsqueeze", [row_scales, b.const([-1])], f"{p}/scales/Unsqueeze")
    scaled = b.op("Mul", [centred, row_scales], f"{p}/Mul")
    batch_seq = b.op("Shape", ["input_ids"], f"{p}/Shape")
    shape = b.op("Concat", [batch_seq, b.const([hidden])], f"{p}/Concat", axis=0)
    return b.op("Reshape", [scaled, shape], f"{p}/Reshape"), scales


def q8_head(b, rows: str, embedding: str, scales: str, w: Q8Weight, prefix: str) -> str:
    """rows @ E^T for the 8-bit tied embedding E: MatMulNBits over its bytes."""
    vocab, hidden = w.shape
    return b.op(
        "MatMulNBits", [rows, embedding, scales], f"{prefix}/MatMulNBits", domain=MS_DOMAIN,
        K=hidden, N=vocab, bits=8, block_size=w.block, accuracy_level=b.nbits_accuracy,
    )

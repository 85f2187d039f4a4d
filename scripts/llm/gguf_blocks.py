"""GGUF's quantized blocks in the layouts of onnxruntime's MatMulNBits.

Every linear-weight type that llama.cpp's common models use becomes one of
two forms without going through float32:

- `Q4Weight`, 4 bits in blocks of 32: Q4_0 (zero point 8), Q4_1 and Q4_K
  (q * scale + minimum; a K-quant's scale and minimum are a float16 per
  super-block of 256 times a 6-bit integer per block of 32);
- `Q8Weight`, 8 bits (the value plus 128, MatMulNBits' default zero point)
  in blocks of 32 or 16: Q8_0, Q5_0, Q5_1 and Q5_K (5-bit values, the _1
  and _K ones with minimums), Q6_K (6-bit values, blocks of 16, an int8
  scale per block times a float16 per super-block).

A K-quant's per-block factors stay factored (`BlockScales`): a float16 and
a small integer, whose product is exact in float32 but not in float16. The
graph multiplies them back at load, so the folder keeps the GGUF's bytes.
Each decoder follows ggml's reference dequantization (ggml-quants.c); the
tests check each type's converted folder against a numpy forward over the
gguf library's own dequantization of the same GGUF.
"""

from dataclasses import dataclass

import gguf
import numpy as np

BLOCK = 32  # the legacy types' block of weights along the input
SUPER = 256  # a K-quant's super-block


@dataclass
class BlockScales:
    """Per-block factors [out, blocks] stored as a K-quant stores them:
    `coarse` (float16 values) per super-block times `fine` per block."""

    coarse: np.ndarray  # float32 [out, supers]
    fine: np.ndarray  # uint8 or int8 [out, blocks]

    @property
    def shape(self) -> tuple[int, int]:
        return self.fine.shape

    def values(self) -> np.ndarray:
        out, blocks = self.fine.shape
        per = blocks // self.coarse.shape[1]
        fine = self.fine.astype(np.float32).reshape(out, -1, per)
        return (fine * self.coarse[..., None]).reshape(out, blocks)


Scales = np.ndarray | BlockScales


def scale_values(s: Scales) -> np.ndarray:
    """The float32 [out, blocks] factors `s` stands for."""
    return s.values() if isinstance(s, BlockScales) else s


def scaled(s: Scales, factor: float) -> Scales:
    if isinstance(s, BlockScales):
        return BlockScales(s.coarse * factor, s.fine)
    return s * factor


def map_rows(a, rows):
    """`rows` (a function of an [out, k] array) applied to every row-major
    part of `a`: an array, BlockScales or None."""
    if a is None:
        return None
    if isinstance(a, BlockScales):
        return BlockScales(map_rows(a.coarse, rows), map_rows(a.fine, rows))
    return rows(a.reshape(a.shape[0], -1)).reshape(a.shape)


def concat_rows(parts: list[Scales]) -> Scales:
    """Factors of several weights, their rows in order: still factored where
    all of them are of one layout, else float32."""
    first = parts[0]
    if all(
        isinstance(p, BlockScales)
        and p.fine.dtype == first.fine.dtype
        and p.fine.shape[1] == first.fine.shape[1]
        and p.coarse.shape[1] == first.coarse.shape[1]
        for p in parts
    ):
        return BlockScales(
            np.concatenate([p.coarse for p in parts]), np.concatenate([p.fine for p in parts])
        )
    return np.concatenate([scale_values(p) for p in parts])


@dataclass
class Q4Weight:
    """A [out, in] 4-bit weight: per block of 32 along the input, a weight is
    q * scale + minimum, q in 0..15. MatMulNBits (bits 4, block 32, zero
    point 0) takes `blobs` and `scales` as they are; the minimums add
    sum(x over the block) * minimum, a small matrix product of their own.
    A Q4_0 weight has no minimums: (q - 8) * scale, MatMulNBits with zero
    point 8."""

    blobs: np.ndarray  # uint8 [out, in / 32, 16]: values 2i, 2i + 1 in low, high nibbles
    scales: Scales  # [out, in / 32]
    minimums: Scales | None  # [out, in / 32]; None: Q4_0

    def with_minimums(self) -> "Q4Weight":
        """The same weight in Q4_1's form: (q - 8) * d = q * d + (-8 * d)."""
        if self.minimums is not None:
            return self
        return Q4Weight(self.blobs, self.scales, scaled(self.scales, -8.0))

    @property
    def shape(self) -> tuple[int, int]:
        out, blocks, _ = self.blobs.shape
        return out, blocks * BLOCK


@dataclass
class Q8Weight:
    """A [out, in] 8-bit weight: per block (`block` weights along the
    input), a weight is (q - 128) * scale (+ minimum) with q in 0..255: what
    MatMulNBits (bits 8) takes without zero points (its default zero point
    is 128), and what a Gather of rows dequantizes exactly."""

    blobs: np.ndarray  # uint8 [out, in / block, block]
    scales: Scales  # [out, in / block]
    minimums: Scales | None = None

    @property
    def block(self) -> int:
        return self.blobs.shape[2]

    @property
    def shape(self) -> tuple[int, int]:
        out, blocks, block = self.blobs.shape
        return out, blocks * block


def _f16(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32."""
    return raw[..., start : start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _blocks(raw: np.ndarray, out_dim: int, in_dim: int, block: int, size: int) -> np.ndarray:
    """A tensor's bytes as [out, in / block, size]."""
    if in_dim % block:
        raise ValueError(f"an input of {in_dim} is not whole blocks of {block}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return raw.reshape(out_dim, in_dim // block, size)


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """4-bit values in order [.., 32] as MatMulNBits' bytes (2i, 2i + 1 in byte i)."""
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def _legacy_low(qs: np.ndarray) -> np.ndarray:
    """A legacy block's 16 bytes of low nibbles as its 32 values in order
    (value j in byte j's low nibble, value j + 16 in its high one)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _legacy_high(qh: np.ndarray) -> np.ndarray:
    """A Q5 block's 4 bytes of fifth bits (value j's in bit j) as 0 or 16 per value."""
    bits = qh.copy().view("<u4")[..., 0]
    return (((bits[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def q4_from_q4_0(raw: np.ndarray, out_dim: int, in_dim: int) -> Q4Weight:
    """Q4_0 (18 bytes a block): float16 d, 16 bytes of q; w = d * (q - 8)."""
    raw = _blocks(raw, out_dim, in_dim, BLOCK, 18)
    return Q4Weight(_pack_nibbles(_legacy_low(raw[..., 2:])), _f16(raw, 0), None)


def q4_from_q4_1(raw: np.ndarray, out_dim: int, in_dim: int) -> Q4Weight:
    """Q4_1 (20 bytes a block): float16 d and m, 16 bytes of q; w = d * q + m."""
    raw = _blocks(raw, out_dim, in_dim, BLOCK, 20)
    return Q4Weight(_pack_nibbles(_legacy_low(raw[..., 4:])), _f16(raw, 0), _f16(raw, 2))


def q8_from_q8_0(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """Q8_0 (34 bytes a block): float16 d, 32 int8 q; w = d * q."""
    raw = _blocks(raw, out_dim, in_dim, BLOCK, 34)
    q = raw[..., 2:].view(np.int8).astype(np.int16) + 128
    return Q8Weight(q.astype(np.uint8), _f16(raw, 0))


def q8_from_q5_0(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """Q5_0 (22 bytes a block): float16 d, 4 bytes of fifth bits, 16 bytes of
    low nibbles; w = d * (q - 16)."""
    raw = _blocks(raw, out_dim, in_dim, BLOCK, 22)
    q = _legacy_low(raw[..., 6:]) | _legacy_high(raw[..., 2:6])
    return Q8Weight((q + (128 - 16)).astype(np.uint8), _f16(raw, 0))


def q8_from_q5_1(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """Q5_1 (24 bytes a block): float16 d and m, 4 bytes of fifth bits, 16
    bytes of low nibbles; w = d * q + m."""
    raw = _blocks(raw, out_dim, in_dim, BLOCK, 24)
    q = _legacy_low(raw[..., 8:]) | _legacy_high(raw[..., 4:8])
    return Q8Weight((q + 128).astype(np.uint8), _f16(raw, 0), _f16(raw, 2))


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and minimums (ggml's
    get_scale_min_k4) as two uint8 [.., 8]."""
    low, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.uint8), m.astype(np.uint8)


def _k_low(qs: np.ndarray) -> np.ndarray:
    """A Q4_K/Q5_K super-block's 128 bytes of nibbles as its 8 blocks of 32
    values ([.., 8, 32]): each 32 bytes hold a block in their low nibbles
    and the next in their high ones."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _k_factors(raw: np.ndarray, out_dim: int) -> tuple[BlockScales, BlockScales]:
    """A Q4_K/Q5_K super-block's scales d * sc and minimums -dmin * m."""
    sc, m = _k_scales(raw[..., 4:16])
    scales = BlockScales(_f16(raw, 0), sc.reshape(out_dim, -1))
    minimums = BlockScales(-_f16(raw, 2), m.reshape(out_dim, -1))
    return scales, minimums


def q4_from_q4_k(raw: np.ndarray, out_dim: int, in_dim: int) -> Q4Weight:
    """Q4_K (144 bytes a super-block of 256): float16 d and dmin, 12 bytes of
    6-bit scales and minimums, 128 bytes of q; block j's weight is
    d * sc_j * q - dmin * m_j."""
    raw = _blocks(raw, out_dim, in_dim, SUPER, 144)
    values = _k_low(raw[..., 16:]).reshape(out_dim, -1, BLOCK)
    return Q4Weight(_pack_nibbles(values), *_k_factors(raw, out_dim))


def q8_from_q5_k(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """Q5_K (176 bytes a super-block): Q4_K's fields and 32 bytes of fifth
    bits (block j's in bit j of byte l, for its value l)."""
    raw = _blocks(raw, out_dim, in_dim, SUPER, 176)
    qh = raw[..., 16:48]
    high = ((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4
    q = (_k_low(raw[..., 48:]) | high).reshape(out_dim, -1, BLOCK)
    return Q8Weight((q + 128).astype(np.uint8), *_k_factors(raw, out_dim))


def q8_from_q6_k(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """Q6_K (210 bytes a super-block of 256): 128 bytes of low nibbles, 64
    of high 2-bit pairs, 16 int8 scales (one a block of 16), float16 d; a
    weight is d * sc * (q - 32), q in 0..63."""
    raw = _blocks(raw, out_dim, in_dim, SUPER, 210)
    ql = raw[..., 0:128].reshape(out_dim, -1, 2, 64)  # two halves of 128 weights
    qh = raw[..., 128:192].reshape(out_dim, -1, 2, 32)
    low = [ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4]
    high = [(qh >> shift) & 3 for shift in (0, 2, 4, 6)]
    q = np.stack([lo | (hi << 4) for lo, hi in zip(low, high)], axis=-2)  # [.., 2, 4, 32]
    blobs = (q.astype(np.int16) + (128 - 32)).astype(np.uint8).reshape(out_dim, -1, 16)
    sc = raw[..., 192:208].copy().view(np.int8).reshape(out_dim, -1)
    return Q8Weight(blobs, BlockScales(_f16(raw, 208), sc))


# The GGUF types kept quantized, each with its decoder.
DECODERS = {
    gguf.GGMLQuantizationType.Q4_0: q4_from_q4_0,
    gguf.GGMLQuantizationType.Q4_1: q4_from_q4_1,
    gguf.GGMLQuantizationType.Q4_K: q4_from_q4_k,
    gguf.GGMLQuantizationType.Q5_0: q8_from_q5_0,
    gguf.GGMLQuantizationType.Q5_1: q8_from_q5_1,
    gguf.GGMLQuantizationType.Q5_K: q8_from_q5_k,
    gguf.GGMLQuantizationType.Q6_K: q8_from_q6_k,
    gguf.GGMLQuantizationType.Q8_0: q8_from_q8_0,
}

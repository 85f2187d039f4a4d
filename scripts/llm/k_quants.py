"""Numpy quantizers for the K-quant types the gguf library only reads.

    q4_k(x), q5_k(x), q6_k(x): float32 [rows, k * 256] -> the GGUF bytes

A plain min/max fit per block (ggml's own quantizers search for better
scales; these need not: they make valid GGUF bytes of each type for the
tests, which read them back with the gguf library and with the converter).
The layouts are ggml's block_q4_K, block_q5_K and block_q6_K.
"""

import numpy as np

SUPER = 256


def _divide(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """x / d where d is not zero, else 0."""
    safe = np.where(d == 0, 1, d)
    return np.where(d == 0, 0, x / safe)


def _half(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _k_fit(x: np.ndarray, levels: int):
    """Q4_K/Q5_K's fit of x [rows, supers, 8, 32]: d, dmin (float16 bytes
    [rows, supers, 2] each), 6-bit sc and m [rows, supers, 8], q in 0..levels."""
    lo = np.minimum(x.min(-1), 0.0)
    scale = (x.max(-1) - lo) / levels
    d = _half(scale.max(-1) / 63)
    dmin = _half((-lo).max(-1) / 63)
    sc = np.clip(np.rint(_divide(scale, d[..., None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_divide(-lo, dmin[..., None])), 0, 63).astype(np.uint8)
    shift = (dmin[..., None] * m)[..., None]
    step = (d[..., None] * sc)[..., None]
    q = np.clip(np.rint(_divide(x + shift, step)), 0, levels).astype(np.uint8)
    halves = [a.astype(np.float16).view(np.uint8).reshape(*a.shape, 2) for a in (d, dmin)]
    return halves, sc, m, q


def _k_scale_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minimums as ggml's 12 bytes (get_scale_min_k4)."""
    first = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    second = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    third = (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)
    return np.concatenate([first, second, third], axis=-1).astype(np.uint8)


def _k_nibbles(q: np.ndarray) -> np.ndarray:
    """8 blocks of 32 values' low 4 bits as 128 bytes: block 2c in the low
    nibbles of bytes 32c.., block 2c + 1 in their high ones."""
    pairs = (q & 0x0F).reshape(*q.shape[:-2], 4, 2, 32)
    return (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(*q.shape[:-2], 128)


def _supers(x: np.ndarray, block: int) -> np.ndarray:
    rows, k = x.shape
    if k % SUPER:
        raise ValueError(f"rows of {k} are not whole super-blocks of {SUPER}")
    return x.astype(np.float32).reshape(rows, k // SUPER, SUPER // block, block)


def q4_k(x: np.ndarray) -> np.ndarray:
    (d, dmin), sc, m, q = _k_fit(_supers(x, 32), 15)
    parts = [d, dmin, _k_scale_bytes(sc, m), _k_nibbles(q)]
    return np.concatenate(parts, axis=-1).reshape(x.shape[0], -1)


def q5_k(x: np.ndarray) -> np.ndarray:
    (d, dmin), sc, m, q = _k_fit(_supers(x, 32), 31)
    fifth = ((q >> 4) & 1) << np.arange(8, dtype=np.uint8)[:, None]  # block j's in bit j
    qh = fifth.sum(axis=-2).astype(np.uint8)  # [rows, supers, 32]
    parts = [d, dmin, _k_scale_bytes(sc, m), qh, _k_nibbles(q)]
    return np.concatenate(parts, axis=-1).reshape(x.shape[0], -1)


def q6_k(x: np.ndarray) -> np.ndarray:
    blocks = _supers(x, 16)  # [rows, supers, 16, 16]
    # Each block's value of largest magnitude, sign kept.
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    scale = peak / -32  # q = -32 at the peak, the widest end
    d = _half(np.abs(scale).max(-1) / 127)
    sc = np.clip(np.rint(_divide(scale, d[..., None])), -128, 127).astype(np.int8)
    step = (d[..., None] * sc)[..., None]
    q = (np.clip(np.rint(_divide(blocks, step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(*q.shape[:2], 2, 4, 32)  # two halves of four quarters
    ql = np.concatenate(
        [q[..., 0, :] | (q[..., 2, :] << 4), q[..., 1, :] | (q[..., 3, :] << 4)], axis=-1
    ) & 0xFF
    high = (q >> 4) & 3
    qh = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6)
    parts = [
        ql.astype(np.uint8).reshape(*q.shape[:2], 128),
        qh.astype(np.uint8).reshape(*q.shape[:2], 64),
        sc.view(np.uint8),
        d.astype(np.float16).view(np.uint8).reshape(*d.shape, 2),
    ]
    return np.concatenate(parts, axis=-1).reshape(x.shape[0], -1)

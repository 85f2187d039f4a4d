"""Llama weights as float32 numpy arrays under Hugging Face names.

Arrays keep the PyTorch layout: a linear layer's weight is [out, in]. They
come either from a GGUF file (dequantized, with llama.cpp's Q/K row
permutation undone) or from a seeded random generator (the tiny test model).
With `keep_q4`, a GGUF's Q4_1 and Q4_0 linear weights stay 4-bit instead
(`Q4Weight`, in onnxruntime's MatMulNBits layout) and its Q8_0 ones 8-bit
(`Q8Weight`), and with
`keep_q8_embedding` a Q8_0 token embedding stays 8-bit (`Q8Weight`, the
same layout with 8 bits).
"""

from dataclasses import dataclass

import gguf
import numpy as np

# Q4_1: blocks of 32 weights along the input, each a float16 scale d, a
# float16 minimum m and 16 bytes of 4-bit values q (byte j holds value j in
# its low nibble and value j + 16 in its high one); a weight is d * q + m.
_Q4_1_BLOCK = 32
_Q4_1_BYTES = 20
# Q4_0: the same blocks with a float16 scale d only; a weight is d * (q - 8).
_Q4_0_BYTES = 18
# Q8_0: blocks of 32 weights along the input, each a float16 scale d and 32
# int8 values q; a weight is d * q.
_Q8_0_BYTES = 34


@dataclass
class Q4Weight:
    """A [out, in] Q4_1 weight: per block of 32 along the input, a weight is
    q * scale + minimum, q in 0..15. MatMulNBits (bits 4, block 32, zero
    point 0) takes `blobs` and `scales` as they are; the minimums add
    sum(x over the block) * minimum, a small matrix product of their own.
    A Q4_0 weight has no minimums: (q - 8) * scale, MatMulNBits with zero
    point 8."""

    blobs: np.ndarray  # uint8 [out, in / 32, 16]: values 2i, 2i + 1 in low, high nibbles
    scales: np.ndarray  # float32 [out, in / 32]
    minimums: np.ndarray | None  # float32 [out, in / 32]; None: Q4_0

    def with_minimums(self) -> "Q4Weight":
        """The same weight in Q4_1's form: (q - 8) * d = q * d + (-8 * d)."""
        if self.minimums is not None:
            return self
        return Q4Weight(self.blobs, self.scales, -8.0 * self.scales)

    @property
    def shape(self) -> tuple[int, int]:
        out, blocks, _ = self.blobs.shape
        return out, blocks * _Q4_1_BLOCK


def q4_from_q4_0(raw: np.ndarray, out_dim: int, in_dim: int) -> Q4Weight:
    """A GGUF Q4_0 tensor's bytes ([out, in / 32 * 18]) in MatMulNBits' layout."""
    blocks = in_dim // _Q4_1_BLOCK
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out_dim, blocks, _Q4_0_BYTES)
    d = raw[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    return Q4Weight(_nibbles(raw[:, :, 2:]), d, None)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF's 4-bit block bytes (value j in byte j's low nibble, value j + 16
    in its high one) in MatMulNBits' order (values 2i, 2i + 1 in byte i)."""
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [out, blocks, 32] in order
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def q4_from_q4_1(raw: np.ndarray, out_dim: int, in_dim: int) -> Q4Weight:
    """A GGUF Q4_1 tensor's bytes ([out, in / 32 * 20]) in MatMulNBits' layout."""
    blocks = in_dim // _Q4_1_BLOCK
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out_dim, blocks, _Q4_1_BYTES)
    d = raw[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = raw[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return Q4Weight(_nibbles(raw[:, :, 4:]), d, m)


@dataclass
class Q8Weight:
    """A [out, in] Q8_0 weight: per block of 32 along the input, a weight is
    (q - 128) * scale with q in 0..255 (GGUF's int8 value plus 128): what
    MatMulNBits (bits 8, block 32) takes without zero points (its default
    zero point is 128), and what a Gather of rows dequantizes exactly."""

    blobs: np.ndarray  # uint8 [out, in / 32, 32]
    scales: np.ndarray  # float32 [out, in / 32]

    @property
    def shape(self) -> tuple[int, int]:
        out, blocks, _ = self.blobs.shape
        return out, blocks * _Q4_1_BLOCK


def q8_from_q8_0(raw: np.ndarray, out_dim: int, in_dim: int) -> Q8Weight:
    """A GGUF Q8_0 tensor's bytes ([out, in / 32 * 34]) in MatMulNBits' layout."""
    blocks = in_dim // _Q4_1_BLOCK
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(out_dim, blocks, _Q8_0_BYTES)
    d = raw[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = raw[:, :, 2:].view(np.int8).astype(np.int16) + 128
    return Q8Weight(q.astype(np.uint8), d)


def dequantize_q8(w: Q8Weight) -> np.ndarray:
    """The float32 [out, in] weight a Q8Weight stands for."""
    values = w.blobs.astype(np.float32) - 128.0
    return (values * w.scales[..., None]).reshape(w.shape)


def dequantize_q4(w: Q4Weight) -> np.ndarray:
    """The float32 [out, in] weight a Q4Weight stands for."""
    values = np.stack([w.blobs & 0x0F, w.blobs >> 4], axis=-1).reshape(*w.blobs.shape[:2], -1)
    w = w.with_minimums()
    weights = values.astype(np.float32) * w.scales[..., None] + w.minimums[..., None]
    return weights.reshape(w.shape)


def _permute_blocks(w: Q4Weight | Q8Weight, num_heads: int) -> Q4Weight | Q8Weight:
    """unpermute_rope_rows on a kept-quantized weight: whole rows move,
    blocks with them."""
    out = w.blobs.shape[0]

    def rows(a):
        if a is None:
            return None
        return unpermute_rope_rows(a.reshape(out, -1), num_heads).reshape(a.shape)

    if isinstance(w, Q8Weight):
        return Q8Weight(rows(w.blobs), rows(w.scales))
    return Q4Weight(rows(w.blobs), rows(w.scales), rows(w.minimums))

from llama_config import LlamaConfig

# GGUF tensor name inside block N -> Hugging Face name inside model.layers.N.
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    base, suffix = gguf_name.rsplit(".", 1)
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    _, layer, kind = base.split(".", 2)
    if kind not in _BLOCK_TENSORS:
        raise ValueError(f"unexpected GGUF tensor {gguf_name}")
    return f"model.layers.{layer}.{_BLOCK_TENSORS[kind]}.{suffix}"


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-RoPE row order of a Q or K projection.

    llama.cpp's converter did reshape(heads, 2, half, in).swapaxes(1, 2);
    this restores the Hugging Face order, where rotate_half pairs dimension
    i with i + head_dim / 2.
    """
    out_dim, in_dim = weight.shape
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, half, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def weights_from_gguf(
    reader: gguf.GGUFReader,
    config: LlamaConfig,
    keep_q4: bool = False,
    keep_q8_embedding: bool = False,
) -> dict[str, np.ndarray | Q4Weight | Q8Weight]:
    """Every tensor of the GGUF file, dequantized to float32 (with
    `keep_q4`, the Q4_1, Q4_0 and Q8_0 linear weights kept as they are;
    with `keep_q8_embedding`, a Q8_0 token embedding kept 8-bit)."""
    kept = {
        gguf.GGMLQuantizationType.Q4_1: q4_from_q4_1,
        gguf.GGMLQuantizationType.Q4_0: q4_from_q4_0,
        gguf.GGMLQuantizationType.Q8_0: q8_from_q8_0,
    }
    weights = {}
    for tensor in reader.tensors:
        expected = tuple(int(d) for d in reversed(tensor.shape))
        name = hf_name(tensor.name)
        is_q8_0 = tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
        if keep_q4 and tensor.tensor_type in kept and name.endswith("_proj.weight"):
            array = kept[tensor.tensor_type](tensor.data, *expected)
        elif keep_q8_embedding and is_q8_0 and name == "model.embed_tokens.weight":
            array = q8_from_q8_0(tensor.data, *expected)
        else:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(
                np.float32, copy=False
            )
        if array.shape != expected:
            raise ValueError(f"{tensor.name}: dequantized shape {array.shape}, want {expected}")
        heads = {"q_proj.weight": config.num_heads, "k_proj.weight": config.num_kv_heads}
        for suffix, count in heads.items():
            if name.endswith(suffix):
                array = (
                    _permute_blocks(array, count)
                    if isinstance(array, (Q4Weight, Q8Weight))
                    else unpermute_rope_rows(array, count)
                )
        quantized = isinstance(array, (Q4Weight, Q8Weight))
        weights[name] = array if quantized else np.ascontiguousarray(array)
    check_complete(weights, config)
    return weights


def weight_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Name and PyTorch-layout shape of every weight, in model order."""
    hidden, q_dim = config.hidden_size, config.num_heads * config.head_dim
    kv_dim = config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (q_dim, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv_dim, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv_dim, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, q_dim)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (config.ffn_size, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (config.ffn_size, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, config.ffn_size)
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def check_complete(
    weights: dict[str, np.ndarray | Q4Weight | Q8Weight], config: LlamaConfig
) -> None:
    """Raise unless `weights` holds exactly the expected names and shapes."""
    shapes = weight_shapes(config)
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ValueError(f"weights: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in shapes.items():
        if weights[name].shape != shape:
            raise ValueError(f"{name}: shape {weights[name].shape}, want {shape}")


def random_weights(config: LlamaConfig, seed: int = 7) -> dict[str, np.ndarray]:
    """Normal(0, 0.02) matrices and all-ones norm weights, reproducible by seed."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return weights

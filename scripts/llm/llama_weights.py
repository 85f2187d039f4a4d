"""Llama weights as float32 numpy arrays under Hugging Face names.

Arrays keep the PyTorch layout: a linear layer's weight is [out, in]. They
come either from a GGUF file (dequantized, with llama.cpp's Q/K row
permutation undone) or from a seeded random generator (the tiny test model).
With `keep_q4`, a GGUF's quantized linear weights stay quantized instead,
in onnxruntime's MatMulNBits layouts (`gguf_blocks`: Q4_0, Q4_1 and Q4_K
4-bit; Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 8-bit), and with
`keep_q8_embedding` a token embedding of a type without minimums (Q8_0,
Q6_K, Q5_0) stays 8-bit for its lookup and the tied head. A head of the
model's own (GGUF `output.weight`) is `lm_head.weight`, a linear weight.
"""

import gguf
import numpy as np

from gguf_blocks import DECODERS, Q4Weight, Q8Weight, map_rows
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
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# The output head of a model whose head is not its embedding.
LM_HEAD = "lm_head.weight"


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    parts = base.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or parts[2] not in _BLOCK_TENSORS:
        # rope_freqs (Llama 3's scaled RoPE), biases, other architectures' tensors.
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")
    _, layer, kind = parts
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


def _permute_blocks(w: Q4Weight | Q8Weight, num_heads: int) -> Q4Weight | Q8Weight:
    """unpermute_rope_rows on a kept-quantized weight: whole rows move,
    blocks with them."""

    def rows(a):
        return map_rows(a, lambda r: unpermute_rope_rows(r, num_heads))

    kind = type(w)
    return kind(rows(w.blobs), rows(w.scales), rows(w.minimums))


def weights_from_gguf(
    reader: gguf.GGUFReader,
    config: LlamaConfig,
    keep_q4: bool = False,
    keep_q8_embedding: bool = False,
) -> dict[str, np.ndarray | Q4Weight | Q8Weight]:
    """Every tensor of the GGUF file, dequantized to float32 (with
    `keep_q4`, the quantized linear weights kept as they are; with
    `keep_q8_embedding`, an 8-bit-able token embedding kept 8-bit)."""
    weights = {}
    for tensor in reader.tensors:
        expected = tuple(int(d) for d in reversed(tensor.shape))
        name = hf_name(tensor.name)
        decode = DECODERS.get(tensor.tensor_type)
        array = None
        linear = name.endswith("_proj.weight") or name == LM_HEAD
        if decode is not None and keep_q4 and linear:
            array = decode(tensor.data, *expected)
        elif decode is not None and keep_q8_embedding and name == "model.embed_tokens.weight":
            array = decode(tensor.data, *expected)
            if not isinstance(array, Q8Weight) or array.minimums is not None:
                array = None  # 4-bit or with minimums: the lookup takes float32
        if array is None:
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
    if not config.tie_word_embeddings:
        shapes[LM_HEAD] = (config.vocab_size, hidden)
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

"""A float64 numpy forward pass of the llama decoder, for checking the ONNX graph.

It reads its weights back from the ONNX initializers (linear weights are
stored [in, out]) and follows the Hugging Face implementation directly:
K/V heads repeated for grouped-query attention, rotate_half RoPE, a causal
plus padding mask. It shares no code with the graph builder.

Or it reads them from the GGUF file itself (`load_gguf`): dequantized by
the gguf library, in llama.cpp's row order, with llama.cpp's interleaved
RoPE (pairs of adjacent dimensions) instead of rotate_half: nothing of the
converter's own dequantization or Q/K row permutation is used, so a bug in
either shows as a difference.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from llama_config import LlamaConfig

# Finite, so that a fully masked row (a left-padding query) stays NaN-free.
_MASKED_SCORE = -1e30


def load_initializers(model_path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def load_gguf(path: Path) -> dict[str, np.ndarray]:
    """A GGUF file's weights under Hugging Face names, dequantized by the
    gguf library, in llama.cpp's row order; linear weights [in, out]."""
    import gguf

    weights = {}
    for tensor in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        name = _hf_name(tensor.name)
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"
        weights[name] = array.T if linear else array
    return weights


def _hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    blocks = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    globals_ = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    base, suffix = gguf_name.rsplit(".", 1)
    if base in globals_:
        return f"{globals_[base]}.{suffix}"
    _, layer, kind = base.split(".", 2)
    return f"model.layers.{layer}.{blocks[kind]}.{suffix}"


def _rope(x: np.ndarray, positions: np.ndarray, theta: float, interleaved: bool) -> np.ndarray:
    """x [B, H, S, D] rotated by position ids [B, S]: dimension i with i + D/2
    (Hugging Face's rotate_half), or 2i with 2i + 1 (llama.cpp's order)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[..., None].astype(np.float64) * inv_freq
    if interleaved:
        cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out
    angles = np.concatenate([angles, angles], axis=-1)[:, None]
    half = dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def _heads(x: np.ndarray, count: int, dim: int) -> np.ndarray:
    batch, seq, _ = x.shape
    return x.reshape(batch, seq, count, dim).transpose(0, 2, 1, 3)


def _attention(w, prefix: str, config: LlamaConfig, x, positions, mask, interleaved) -> np.ndarray:
    d, theta = config.head_dim, config.rope_theta
    q = _heads(x @ w[f"{prefix}.q_proj.weight"], config.num_heads, d)
    k = _heads(x @ w[f"{prefix}.k_proj.weight"], config.num_kv_heads, d)
    v = _heads(x @ w[f"{prefix}.v_proj.weight"], config.num_kv_heads, d)
    q, k = _rope(q, positions, theta, interleaved), _rope(k, positions, theta, interleaved)
    k = np.repeat(k, config.kv_groups, axis=1)
    v = np.repeat(v, config.kv_groups, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.where(mask, scores, _MASKED_SCORE)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return context @ w[f"{prefix}.o_proj.weight"]


def forward(
    weights: dict[str, np.ndarray],
    config: LlamaConfig,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    interleaved_rope: bool = False,
) -> np.ndarray:
    """Logits [B, S, V] of a full sequence (no cache); position ids from the mask.
    `interleaved_rope` for weights in llama.cpp's row order (`load_gguf`).

    Rows whose attention_mask is 0 (left padding) are not meaningful.
    """
    w = {name: array.astype(np.float64) for name, array in weights.items()}
    seq = input_ids.shape[1]
    positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    mask = causal[None, None] & attention_mask.astype(bool)[:, None, None, :]
    x = w["model.embed_tokens.weight"][input_ids]
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}"
        normed = _rms_norm(x, w[f"{prefix}.input_layernorm.weight"], config.rms_eps)
        attention = _attention(
            w, f"{prefix}.self_attn", config, normed, positions, mask, interleaved_rope
        )
        x = x + attention
        normed = _rms_norm(x, w[f"{prefix}.post_attention_layernorm.weight"], config.rms_eps)
        gate = normed @ w[f"{prefix}.mlp.gate_proj.weight"]
        up = normed @ w[f"{prefix}.mlp.up_proj.weight"]
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[f"{prefix}.mlp.down_proj.weight"]
    x = _rms_norm(x, w["model.norm.weight"], config.rms_eps)
    if "lm_head.weight" in w:  # an untied head, [in, out] as linear weights are
        return x @ w["lm_head.weight"]
    return x @ w["model.embed_tokens.weight"].T

"""A float64 numpy forward pass of the llama decoder, for checking the ONNX graph.

It reads its weights back from the ONNX initializers (linear weights are
stored [in, out]) and follows the Hugging Face implementation directly:
K/V heads repeated for grouped-query attention, rotate_half RoPE, a causal
plus padding mask. It shares no code with the graph builder.
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


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [B, H, S, D] rotated by position ids [B, S]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[..., None].astype(np.float64) * inv_freq
    angles = np.concatenate([angles, angles], axis=-1)[:, None]
    half = dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def _heads(x: np.ndarray, count: int, dim: int) -> np.ndarray:
    batch, seq, _ = x.shape
    return x.reshape(batch, seq, count, dim).transpose(0, 2, 1, 3)


def _attention(w, prefix: str, config: LlamaConfig, x, positions, mask) -> np.ndarray:
    d, theta = config.head_dim, config.rope_theta
    q = _heads(x @ w[f"{prefix}.q_proj.weight"], config.num_heads, d)
    k = _heads(x @ w[f"{prefix}.k_proj.weight"], config.num_kv_heads, d)
    v = _heads(x @ w[f"{prefix}.v_proj.weight"], config.num_kv_heads, d)
    q, k = _rope(q, positions, theta), _rope(k, positions, theta)
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
) -> np.ndarray:
    """Logits [B, S, V] of a full sequence (no cache); position ids from the mask.

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
        x = x + _attention(w, f"{prefix}.self_attn", config, normed, positions, mask)
        normed = _rms_norm(x, w[f"{prefix}.post_attention_layernorm.weight"], config.rms_eps)
        gate = normed @ w[f"{prefix}.mlp.gate_proj.weight"]
        up = normed @ w[f"{prefix}.mlp.up_proj.weight"]
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[f"{prefix}.mlp.down_proj.weight"]
    x = _rms_norm(x, w["model.norm.weight"], config.rms_eps)
    return x @ w["model.embed_tokens.weight"].T

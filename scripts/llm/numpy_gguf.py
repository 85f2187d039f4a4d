#!/usr/bin/env python3
"""A float64 numpy forward pass of a llama-architecture GGUF file, as
llama.cpp computes it, over the weights as the file stores them (each
quantized tensor dequantized by the gguf library, `gguf.quants.dequantize`).

    numpy_gguf.py MODEL.gguf --tokens 1,2,3 [--out logits.npy] [--llama-cpp-activations]

It differs from llama.cpp by llama.cpp's own rounding only (float32
arithmetic, activations rounded to F16/BF16/8-bit blocks for the matrix
products of F16/BF16/quantized weights, the KV cache's type), so comparing
the two says what tolerance a comparison against llama.cpp can hold.
With --llama-cpp-activations (forward(..., llama_cpp_activations=True))
it rounds the activations as llama.cpp's CPU backend does and then agrees
with llama-ref's logits (F32 KV cache) to ~1e-7 of the largest logit at
most positions for every quantized type and BF16; at a few positions it
does not (up to ~3e-2: an 8-bit rounding that falls the other way because
float64 and float32 activations differ in the last bits, amplified by the
random model), and F16 keeps a ~4e-4 difference not accounted for.

The model: RMSNorm, grouped-query attention with a causal mask and the
1/sqrt(head_dim) scale, RoPE in llama.cpp's "normal" mode (dimension 2i
rotates with 2i + 1) over the GGUF's own q/k row order, SwiGLU, a tied or
untied head. RoPE frequencies as ggml_rope_ext with ext_factor 0:
theta_i = pos * freq_scale / rope_freqs[i] * freq_base^(-2i/head_dim), where
freq_scale is 1/llama.rope.scaling.factor unless llama.rope.scaling.type is
"none" (llama.cpp's default type is "linear"), and rope_freqs (Llama 3's
factors) 1 where the file has no rope_freqs.weight. Only plain, linear
and rope_freqs scaling: yarn and longrope are refused. llama.cpp's llama
architecture ignores llama.attention.sliding_window, and so does this
unless --sliding-window asks for it (Mistral's window, which Tessera
honours: a query sees itself and the window's n - 1 positions before it).

Weights under Hugging Face names ([in, out] for linear weights) and the
rest of the numpy code (RMSNorm, head reshaping) are numpy_llama's.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_config import LlamaConfig  # noqa: E402
from numpy_llama import _MASKED_SCORE, _heads, _hf_name, _rms_norm  # noqa: E402


@dataclass(frozen=True)
class GgufModel:
    config: LlamaConfig
    weights: dict  # Hugging Face names -> float64 arrays, linear weights [in, out]
    freq_scale: float
    rope_factors: np.ndarray | None  # [head_dim/2] or None
    tensor_types: dict  # Hugging Face names -> gguf.GGMLQuantizationType as stored
    block_mins: dict  # Q4_1/Q5_1 weights' block minimums m [out, in/32] (llama_cpp_activations)


def _field(reader, key, default=None):
    found = reader.get_field(key)
    return default if found is None else found.contents()


def load(path) -> GgufModel:
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r} (want llama)")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // heads))
    if int(_field(reader, "llama.attention.value_length", head_dim)) != head_dim:
        raise ValueError("key_length != value_length is not supported")
    if int(_field(reader, "llama.rope.dimension_count", head_dim)) != head_dim:
        raise ValueError("partial RoPE (rope.dimension_count != head_dim) is not supported")
    scaling = _field(reader, "llama.rope.scaling.type", "linear")
    if scaling not in ("none", "linear"):
        raise ValueError(f"RoPE scaling {scaling!r} is not supported (none or linear)")
    factor = float(_field(reader, "llama.rope.scaling.factor", _field(reader, "llama.rope.scale_linear", 0.0)))
    freq_scale = 1.0 if scaling == "none" or factor == 0.0 else 1.0 / factor
    tokens = _field(reader, "tokenizer.ggml.tokens")
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id", 0))

    weights, types, mins, rope_factors = {}, {}, {}, None
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float64)
        if tensor.name == "rope_freqs.weight":
            rope_factors = array
            continue
        name = _hf_name(tensor.name)
        types[name] = tensor.tensor_type
        if tensor.tensor_type in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q5_1):
            # block_q4_1 / block_q5_1 start with F16 d, then F16 m
            raw = np.ascontiguousarray(tensor.data).reshape(shape[0], -1, tensor.data.shape[-1] * 32 // shape[1])
            mins[name] = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"
        weights[name] = array.T if linear else array
    config = LlamaConfig(
        num_layers=int(_field(reader, "llama.block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        ffn_size=int(_field(reader, "llama.feed_forward_length")),
        vocab_size=weights["model.embed_tokens.weight"].shape[0],
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context_length=int(_field(reader, "llama.context_length")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 0)),
        eos_token_id=eos,
        pad_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id", eos)),
        tie_word_embeddings="lm_head.weight" not in weights,
    )
    if tokens is not None and len(tokens) != config.vocab_size:
        raise ValueError(f"{len(tokens)} tokens but {config.vocab_size} embedding rows")
    return GgufModel(config, weights, freq_scale, rope_factors, types, mins)


def rope_angles(model: GgufModel, positions: np.ndarray) -> np.ndarray:
    """[S, head_dim/2] angles for position ids [S]."""
    d = model.config.head_dim
    inv_freq = model.config.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if model.rope_factors is not None:
        inv_freq = inv_freq / model.rope_factors
    return positions[:, None].astype(np.float64) * model.freq_scale * inv_freq


def _rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """x [H, S, D] rotated pairwise (2i with 2i + 1) by angles [S, D/2]."""
    cos, sin = np.cos(angles)[None], np.sin(angles)[None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


# ---------------------------------------------------------------- llama.cpp's activation rounding

def _round_f16(x):
    return x.astype(np.float32).astype(np.float16).astype(np.float64)


def _round_bf16(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


def _blocks(x, size):
    return x.astype(np.float32).reshape(-1, size)


def _q8_blocks(x):
    """x in 32-value blocks as ggml-cpu's quantize_row_q8_0/q8_1 (x86) make
    them: d = amax/127, q = round(x * 127/amax); the values q * F16(d), and
    the blocks' F16(d * sum(q)) (Q8_1's s)."""
    b = _blocks(x, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.round(b * inv)
    values = (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape).astype(np.float64)
    sums = (d[:, 0] * q.sum(axis=1)).astype(np.float16).astype(np.float64)
    return values, sums.reshape(*x.shape[:-1], -1)


def _round_q8_0(x):
    return _q8_blocks(x)[0]


def _round_q8_k(x):  # quantize_row_q8_K: float d = 1/(-127/max), max the signed extreme
    b = _blocks(x, 256)
    idx = np.abs(b).argmax(axis=1)
    extreme = b[np.arange(len(b)), idx][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(extreme != 0, np.float32(-127) / extreme, 0).astype(np.float32)
        q = np.minimum(np.round(iscale * b), 127)
        d = np.where(iscale != 0, np.float32(1) / iscale, 0).astype(np.float32)
    return (q * d).reshape(x.shape).astype(np.float64)


Q = gguf.GGMLQuantizationType
# The type a matrix product's activations are rounded to before it, by the
# weight's type (ggml-cpu's vec_dot_type); Q4_1/Q5_1 (Q8_1) in _matmul.
_ACTIVATION_ROUNDING = {
    Q.F16: _round_f16, Q.BF16: _round_bf16,
    Q.Q4_0: _round_q8_0, Q.Q5_0: _round_q8_0, Q.Q8_0: _round_q8_0,
    Q.Q2_K: _round_q8_k, Q.Q3_K: _round_q8_k, Q.Q4_K: _round_q8_k,
    Q.Q5_K: _round_q8_k, Q.Q6_K: _round_q8_k,
}


def _matmul(model: GgufModel, x: np.ndarray, name: str, weight: np.ndarray) -> np.ndarray:
    """x @ weight ([in, out]) with x rounded as llama.cpp rounds it for the
    weight's type. Q4_1/Q5_1 against Q8_1: the dot product of a block is
    d_w d_x sum(q_w q_x) + m_w s_x with s_x = F16(d_x sum(q_x)), i.e. the
    dequantized weights times the Q8 values plus m_w (s_x - sum of the
    block's Q8 values), F16's rounding of s_x included."""
    kind = model.tensor_types[name]
    if kind in (Q.Q4_1, Q.Q5_1):
        values, sums = _q8_blocks(x)
        block_values = values.reshape(*x.shape[:-1], -1, 32).sum(axis=-1)
        return values @ weight + (sums - block_values) @ model.block_mins[name].T
    return _ACTIVATION_ROUNDING.get(kind, lambda v: v)(x) @ weight


def forward(model: GgufModel, tokens, llama_cpp_activations: bool = False,
            window: int | None = None) -> np.ndarray:
    """Logits [S, V] of every position of one sequence (positions 0..S-1).

    window: attend to the last `window` positions only (the position
    itself included), as Mistral's sliding window does where llama.cpp's
    llama architecture does not.

    llama_cpp_activations: round the input of each matrix product as
    llama.cpp's CPU backend does for that weight's type (to F16, BF16, or
    8-bit blocks: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for
    the K-quants), which is where its logits and exact arithmetic part:
    for the quantized types this reproduces llama.cpp's logits to ~1e-7 of
    their scale."""
    c, w = model.config, model.weights

    def mm(x, name, weight=None):
        weight = w[name] if weight is None else weight
        return _matmul(model, x, name, weight) if llama_cpp_activations else x @ weight
    ids = np.asarray(tokens, dtype=np.int64)
    seq = len(ids)
    angles = rope_angles(model, np.arange(seq))
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    if window is not None:
        causal &= np.triu(np.ones((seq, seq), dtype=bool), -(window - 1))
    x = w["model.embed_tokens.weight"][ids][None]  # [1, S, hidden]
    for layer in range(c.num_layers):
        p = f"model.layers.{layer}"
        h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], c.rms_eps)
        q = _heads(mm(h, f"{p}.self_attn.q_proj.weight"), c.num_heads, c.head_dim)[0]
        k = _heads(mm(h, f"{p}.self_attn.k_proj.weight"), c.num_kv_heads, c.head_dim)[0]
        v = _heads(mm(h, f"{p}.self_attn.v_proj.weight"), c.num_kv_heads, c.head_dim)[0]
        q, k = _rope(q, angles), _rope(k, angles)
        k = np.repeat(k, c.kv_groups, axis=0)
        v = np.repeat(v, c.kv_groups, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(c.head_dim)
        scores = np.where(causal[None], scores, _MASKED_SCORE)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(1, seq, -1)
        x = x + mm(context, f"{p}.self_attn.o_proj.weight")
        h = _rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], c.rms_eps)
        gate = mm(h, f"{p}.mlp.gate_proj.weight")
        up = mm(h, f"{p}.mlp.up_proj.weight")
        x = x + mm(gate / (1.0 + np.exp(-gate)) * up, f"{p}.mlp.down_proj.weight")
    x = _rms_norm(x, w["model.norm.weight"], c.rms_eps)[0]
    if "lm_head.weight" in w:
        return mm(x, "lm_head.weight")
    return mm(x, "model.embed_tokens.weight", w["model.embed_tokens.weight"].T)


def main() -> None:
    p = argparse.ArgumentParser(description="float64 logits of a llama GGUF (every position)")
    p.add_argument("model")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", help="write the logits [S, V] as float64 .npy here")
    p.add_argument("--llama-cpp-activations", action="store_true",
                   help="round matrix products' inputs as llama.cpp's CPU backend does")
    p.add_argument("--sliding-window", action="store_true",
                   help="honour llama.attention.sliding_window (llama.cpp's llama architecture ignores it)")
    args = p.parse_args()
    model = load(args.model)
    window = None
    if args.sliding_window:
        window = int(_field(gguf.GGUFReader(args.model), "llama.attention.sliding_window"))
    logits = forward(model, [int(t) for t in args.tokens.split(",")], args.llama_cpp_activations,
                     window)
    if args.out:
        np.save(args.out, logits)
    print(f"logits {logits.shape}, argmax of the last position {int(np.argmax(logits[-1]))}, "
          f"max |logit| {np.abs(logits).max():.4g}")


if __name__ == "__main__":
    main()

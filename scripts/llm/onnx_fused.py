"""The 4-bit decoder with onnxruntime's fused operators, one node where the
plain graph has tens: SmolLM2-135M is ~1,100 nodes instead of ~2,500, and
where a kernel computes for microseconds its fixed cost is most of its
time (a decode step on one thread: 1.6x faster, then 1.1x with attention
as one node).

- RMS norms are com.microsoft `SkipSimplifiedLayerNormalization` (the
  residual add and the norm in one node; standard ops for the first, which
  has no residual yet).
- q, k and v are one `MatMulNBits` over their rows stacked, as are gate and
  up (and the minimums one small product each), where they are of one form.
- Attention is com.microsoft `GroupQueryAttention` over the packed q/k/v:
  RoPE at position_ids (cos and sin tables of the context's length), the
  cache appended at each row's own length (`seqlens_k` from the attention
  mask), so a decode batch pads each row after its positions (the model
  says so: metadata `tessera.padding` = `right`) and a short row reads
  only its own.

The interface (inputs, outputs, state pairs) is the plain graph's.
"""

import numpy as np
from onnx import TensorProto

from llama_config import LlamaConfig
from gguf_blocks import Q4Weight, Q8Weight, concat_rows
from onnx_graph import MS_DOMAIN, GraphBuilder, linear, rms_norm



def stacked(weights: dict, names: list[str]) -> Q4Weight | Q8Weight | np.ndarray | None:
    """Several [out, in] weights of the same input as one, their rows in
    order, where they are of one form: 4-bit (Q4_0 rows among ones with
    minimums in that form), 8-bit of one block size, or float32. None where
    the forms differ (a GGUF such as Q4_K_M keeps v in Q6_K and q, k in
    Q4_K): each is then a product of its own."""
    parts = [weights[n] for n in names]
    kinds = {(type(w), getattr(w, "block", None)) for w in parts}
    if len(kinds) > 1:
        return None
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    if any(w.minimums is not None for w in parts):
        parts = [with_minimums(w) for w in parts]
        minimums = concat_rows([w.minimums for w in parts])
    else:
        minimums = None
    blobs = np.concatenate([w.blobs for w in parts])
    return type(parts[0])(blobs, concat_rows([w.scales for w in parts]), minimums)


def with_minimums(w: Q4Weight | Q8Weight) -> Q4Weight | Q8Weight:
    """The same weight with minimums (zeros for an 8-bit one without)."""
    if isinstance(w, Q4Weight):
        return w.with_minimums()
    if w.minimums is not None:
        return w
    return Q8Weight(w.blobs, w.scales, np.zeros(w.scales.shape, dtype=np.float32))


def packed_linear(
    b: GraphBuilder, x: str, weights: dict, names: list[str], name: str, prefix: str
) -> str:
    """x @ [W1; W2; ...]^T: one product where the weights stack, else one
    each, their outputs concatenated."""
    w = stacked(weights, names)
    if w is not None:
        return linear(b, x, {name: w}, name, prefix)
    parts = [linear(b, x, weights, n, f"{prefix}/{i}") for i, n in enumerate(names)]
    return b.op("Concat", parts, f"{prefix}/Concat", axis=-1)


def stacked_linear(
    b: GraphBuilder, x: str, weights: dict, names: list[str], name: str, prefix: str
) -> list[str]:
    """x @ W^T for each weight: one MatMulNBits split back per weight where
    they stack, else one product each."""
    w = stacked(weights, names)
    if w is None:
        return [linear(b, x, weights, n, f"{prefix}/{i}") for i, n in enumerate(names)]
    joined = linear(b, x, {name: w}, name, prefix)
    sizes = [weights[n].shape[0] for n in names]
    outputs = [f"{prefix}/Split/output_{i}" for i in range(len(names))]
    b.op_outputs("Split", [joined, b.const(sizes)], f"{prefix}/Split", outputs, axis=-1)
    return outputs


def skip_rms_norm(
    b: GraphBuilder, x: str, residual: str, weights: dict, name: str, prefix: str, eps: float
) -> tuple[str, str]:
    """(rms_norm(x + residual), x + residual) in one node."""
    weight = b.weight(name, weights[name])
    normed, total = f"{prefix}/output_0", f"{prefix}/output_3"
    b.op_outputs(
        "SkipSimplifiedLayerNormalization", [x, residual, weight], prefix,
        [normed, "", "", total], domain=MS_DOMAIN, epsilon=eps,
    )
    return normed, total


def rotary_caches(b: GraphBuilder, config: LlamaConfig) -> tuple[str, str]:
    """cos and sin of position * inv_freq: [context, D / 2] each."""
    exponents = np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
    inv_freq = 1.0 / config.rope_theta**exponents
    angles = np.outer(np.arange(config.context_length, dtype=np.float64), inv_freq)
    cos = b.weight("model.rotary_emb.cos_cache", np.cos(angles).astype(np.float32))
    sin = b.weight("model.rotary_emb.sin_cache", np.sin(angles).astype(np.float32))
    return cos, sin


def attention_inputs(b: GraphBuilder) -> dict:
    """What every layer's GroupQueryAttention reads besides q, k, v and the
    cache: each row's length (`seqlens_k`: its attention mask's sum less
    one) and the mask's width T. A row's padding is after its own
    positions (the model's `tessera.padding` is `right`): the attention
    appends the new position at the row's own length and reads that many,
    so a short row in a decode batch does not read the longest row's
    positions (padding before them would be read, masked or not)."""
    p = "/model/attn_lengths"
    lengths = b.op("ReduceSum", ["attention_mask", b.const([1])], f"{p}/ReduceSum", keepdims=0)
    lengths = b.op("Cast", [lengths], f"{p}/Cast", to=TensorProto.INT32)
    seqlens = b.op("Sub", [lengths, b.const(1, np.int32)], f"{p}/seqlens/Sub")
    total = b.op("Shape", ["attention_mask"], f"{p}/total/Shape", start=1, end=2)
    total = b.op("Cast", [total], f"{p}/total/Cast", to=TensorProto.INT32)
    total = b.op("Squeeze", [total, b.const([0])], f"{p}/total/Squeeze")
    return {"seqlens": seqlens, "total": total}


def fused_attention(
    b: GraphBuilder, config: LlamaConfig, weights: dict, x: str, layer: int, shared: dict
) -> str:
    """One layer's attention block: q, k and v as one product, then
    com.microsoft GroupQueryAttention over them packed, which turns q and k
    by RoPE at position_ids, appends k and v to the cache (present.N.key /
    .value) and attends over it."""
    p, w = f"/model/layers.{layer}/self_attn", f"model.layers.{layer}.self_attn"
    names = [f"{w}.{m}_proj.weight" for m in ("q", "k", "v")]
    name = f"{w}.qkv_proj.weight"
    qkv = packed_linear(b, x, weights, names, name, f"{p}/qkv_proj")
    attn = shared["attention"]
    cos, sin = shared["rotary"]
    past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
    inputs = [qkv, "", "", past_k, past_v, attn["seqlens"], attn["total"], cos, sin,
              "position_ids"]
    context = f"{p}/GroupQueryAttention/output_0"
    outputs = [context, f"present.{layer}.key", f"present.{layer}.value"]
    b.op_outputs(
        "GroupQueryAttention", inputs, f"{p}/GroupQueryAttention", outputs, domain=MS_DOMAIN,
        num_heads=config.num_heads, kv_num_heads=config.num_kv_heads, do_rotary=1,
        rotary_interleaved=0,
    )
    return linear(b, context, weights, f"{w}.o_proj.weight", f"{p}/o_proj")


def fused_mlp(b: GraphBuilder, weights: dict, x: str, layer: int) -> str:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one product."""
    p, w = f"/model/layers.{layer}/mlp", f"model.layers.{layer}.mlp"
    names = [f"{w}.gate_proj.weight", f"{w}.up_proj.weight"]
    gate, up = stacked_linear(b, x, weights, names, f"{w}.gate_up_proj.weight", f"{p}/gate_up")
    sigmoid = b.op("Sigmoid", [gate], f"{p}/act_fn/Sigmoid")
    silu = b.op("Mul", [gate, sigmoid], f"{p}/act_fn/Mul")
    hidden = b.op("Mul", [silu, up], f"{p}/Mul")
    return linear(b, hidden, weights, f"{w}.down_proj.weight", f"{p}/down_proj")


def fused_layers(
    b: GraphBuilder, config: LlamaConfig, weights: dict, x: str, shared: dict
) -> tuple[str, str]:
    """Every decoder layer; the last block's output and its residual, for
    the final norm to add."""
    eps, residual, delta = config.rms_eps, x, None
    for layer in range(config.num_layers):
        p, w = f"/model/layers.{layer}", f"model.layers.{layer}"
        name = f"{w}.input_layernorm.weight"
        if delta is None:  # the first: no residual to add yet
            normed = rms_norm(b, residual, weights, name, f"{p}/input_layernorm", eps)
        else:
            normed, residual = skip_rms_norm(
                b, delta, residual, weights, name, f"{p}/input_layernorm", eps
            )
        attn = fused_attention(b, config, weights, normed, layer, shared)
        name = f"{w}.post_attention_layernorm.weight"
        normed, residual = skip_rms_norm(
            b, attn, residual, weights, name, f"{p}/post_attention_layernorm", eps
        )
        delta = fused_mlp(b, weights, normed, layer)
    return delta, residual


def fused_final_norm(
    b: GraphBuilder, config: LlamaConfig, weights: dict, delta: str, residual: str
) -> str:
    normed, _ = skip_rms_norm(
        b, delta, residual, weights, "model.norm.weight", "/model/norm", config.rms_eps
    )
    return normed


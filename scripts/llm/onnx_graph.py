"""Build a llama decoder as a plain-op ONNX graph (opset 17) with a KV cache.

The interface is the Hugging Face Optimum / onnxruntime-genai one:
inputs input_ids, attention_mask, position_ids and past_key_values.N.key /
.value; outputs logits and present.N.key / .value. Only standard ONNX
operators are used (no com.microsoft ops), so any ONNX runtime can run it,
except where weights are kept quantized (`onnx_quantized`): linear weights
become onnxruntime's com.microsoft MatMulNBits (4 or 8 bits), and an 8-bit
token embedding stays 8-bit for both its uses: the lookup gathers its rows
and their scales and dequantizes them (standard ops), the tied head is
MatMulNBits (bits 8) over the same bytes.
RoPE and the attention mask are computed once and shared by every layer;
grouped-query attention broadcasts K/V over the query groups instead of
copying them.
"""

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from llama_config import LlamaConfig
from gguf_blocks import Q4Weight, Q8Weight
from llama_weights import LM_HEAD
from onnx_quantized import MS_DOMAIN, q4_linear, q8_embedding, q8_head, q8_linear

OPSET = 17
IR_VERSION = 8
PRODUCER = "tessera-convert-gguf"
STATE_PAIRS_KEY = "tessera.state_pairs"
# Where a decode batch pads each row's cache (Tessera reads it): "right",
# after the row's positions, for a graph that reads each row's length from
# its mask; absent, before them.
PADDING_KEY = "tessera.padding"
MASKED_SCORE = float(np.finfo(np.float32).min)
# MatMulNBits' accuracy level: 4 computes with int8 activations (onnxruntime's
# fastest CPU kernels), 0 in float32 (slower; what checks use to see the
# graph exact, without int8 rounding).
NBITS_ACCURACY = 4


class GraphBuilder:
    """Collects nodes and initializers; every op returns its output's name."""

    def __init__(self, nbits_accuracy: int = NBITS_ACCURACY):
        self.nbits_accuracy = nbits_accuracy
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self._node_names: set[str] = set()

    def made(self, name: str) -> bool:
        """Whether a node of this name exists already."""
        return name in self._node_names

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers[name] = array
        return name

    def half_weight(self, name: str, array: np.ndarray) -> str:
        """A float32 weight whose values are float16 ones (a GGUF block's
        scale or minimum): stored as float16 under `name`.f16, half the
        bytes, and `name` is its Cast to float32, which onnxruntime (and
        Tessera's simplification) fold into a constant at load."""
        half = array.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), array):
            raise ValueError(f"{name} holds values float16 cannot hold")
        stored = self.weight(f"{name}.f16", half)
        return self.op("Cast", [stored], f"{name}/Cast", output=name, to=TensorProto.FLOAT)

    def const(self, values, dtype=np.int64) -> str:
        """A small shared constant (shape, axis, scalar), named by its value."""
        array = np.asarray(values, dtype=dtype)
        if array.ndim:
            text = "_".join(str(v) for v in array.reshape(-1))
        else:
            text = f"scalar_{array.item()}"
        name = f"/model/constants/{array.dtype.name}_{text}"
        self.initializers.setdefault(name, array)
        return name

    def op(
        self, op_type: str, inputs: list[str], name: str, output: str | None = None, **attrs
    ) -> str:
        output = output or f"{name}/output_0"
        return self.op_outputs(op_type, inputs, name, [output], **attrs)[0]

    def op_outputs(
        self, op_type: str, inputs: list[str], name: str, outputs: list[str], **attrs
    ) -> list[str]:
        """A node of several outputs ("" for one left out)."""
        if name in self._node_names:
            raise ValueError(f"duplicate node name {name}")
        self._node_names.add(name)
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs


def _tensor_info(name: str, elem_type: int, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


def graph_inputs(config: LlamaConfig) -> list[onnx.ValueInfoProto]:
    inputs = [
        _tensor_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        _tensor_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        _tensor_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
    ]
    past_dims = ["batch_size", config.num_kv_heads, "past_sequence_length", config.head_dim]
    for layer in range(config.num_layers):
        for kind in ("key", "value"):
            inputs.append(
                _tensor_info(f"past_key_values.{layer}.{kind}", TensorProto.FLOAT, past_dims)
            )
    return inputs


def graph_outputs(config: LlamaConfig, last_only: bool) -> list[onnx.ValueInfoProto]:
    positions = 1 if last_only else "sequence_length"
    outputs = [
        _tensor_info("logits", TensorProto.FLOAT, ["batch_size", positions, config.vocab_size])
    ]
    present_dims = ["batch_size", config.num_kv_heads, "total_sequence_length", config.head_dim]
    for layer in range(config.num_layers):
        for kind in ("key", "value"):
            outputs.append(_tensor_info(f"present.{layer}.{kind}", TensorProto.FLOAT, present_dims))
    return outputs


def state_pairs(config: LlamaConfig) -> list[list[str]]:
    """[present output, past input] for every cache tensor."""
    return [
        [f"present.{layer}.{kind}", f"past_key_values.{layer}.{kind}"]
        for layer in range(config.num_layers)
        for kind in ("key", "value")
    ]


def rms_norm(b: GraphBuilder, x: str, weights: dict, name: str, prefix: str, eps: float) -> str:
    """x * 1 / sqrt(mean(x^2) + eps) * weight over the last axis."""
    weight = b.weight(name, weights[name])
    square = b.op("Mul", [x, x], f"{prefix}/Mul")
    mean = b.op("ReduceMean", [square], f"{prefix}/ReduceMean", axes=[-1], keepdims=1)
    shifted = b.op("Add", [mean, b.const(eps, np.float32)], f"{prefix}/Add")
    root = b.op("Sqrt", [shifted], f"{prefix}/Sqrt")
    inverse = b.op("Div", [b.const(1.0, np.float32), root], f"{prefix}/Div")
    normed = b.op("Mul", [x, inverse], f"{prefix}/Mul_1")
    return b.op("Mul", [normed, weight], f"{prefix}/Mul_2")


def linear(b: GraphBuilder, x: str, weights: dict, name: str, prefix: str) -> str:
    """x @ W^T; the initializer holds W^T ([in, out]) under the module's name,
    or a 4-bit W (see `q4_linear`) or an 8-bit one (`q8_linear`)."""
    w = weights[name]
    if isinstance(w, Q4Weight):
        return q4_linear(b, x, w, name, prefix)
    if isinstance(w, Q8Weight):
        return q8_linear(b, x, w, name, prefix)
    weight_t = b.weight(name, np.ascontiguousarray(w.T))
    return b.op("MatMul", [x, weight_t], f"{prefix}/MatMul")


def rotary_tables(b: GraphBuilder, config: LlamaConfig) -> tuple[str, str]:
    """cos and sin of position * inv_freq, duplicated to head_dim: [B, 1, S, D]."""
    p = "/model/rotary_emb"
    exponents = np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
    inv_freq = b.weight(
        "model.rotary_emb.inv_freq", (1.0 / config.rope_theta**exponents).astype(np.float32)
    )
    positions = b.op("Cast", ["position_ids"], f"{p}/Cast", to=TensorProto.FLOAT)
    positions = b.op("Unsqueeze", [positions, b.const([2])], f"{p}/Unsqueeze")
    freqs = b.op("Mul", [positions, inv_freq], f"{p}/Mul")
    angles = b.op("Concat", [freqs, freqs], f"{p}/Concat", axis=-1)
    cos = b.op("Cos", [angles], f"{p}/Cos")
    sin = b.op("Sin", [angles], f"{p}/Sin")
    cos = b.op("Unsqueeze", [cos, b.const([1])], f"{p}/Unsqueeze_cos")
    sin = b.op("Unsqueeze", [sin, b.const([1])], f"{p}/Unsqueeze_sin")
    return cos, sin


def _dim(b: GraphBuilder, tensor: str, axis: int, prefix: str) -> str:
    """The size of one axis of `tensor` as an int64 scalar."""
    shape = b.op("Shape", [tensor], f"{prefix}/Shape")
    return b.op("Gather", [shape, b.const(axis)], f"{prefix}/Gather", axis=0)


def attention_mask(b: GraphBuilder) -> str:
    """Causal and padding mask, True where a query may attend: [B, 1, 1, S, T].

    Query i sits at absolute position past_length + i; key j may be seen
    when j <= that position and attention_mask[b, j] is non-zero.
    """
    p = "/model/attn_mask"
    past = _dim(b, "past_key_values.0.key", 2, f"{p}/past_length")
    new = _dim(b, "input_ids", 1, f"{p}/sequence_length")
    total = _dim(b, "attention_mask", 1, f"{p}/total_length")
    zero, one = b.const(0), b.const(1)
    key_pos = b.op("Range", [zero, total, one], f"{p}/key_positions/Range")
    end = b.op("Add", [past, new], f"{p}/query_end/Add")
    query_pos = b.op("Range", [past, end, one], f"{p}/query_positions/Range")
    key_row = b.op("Unsqueeze", [key_pos, b.const([0])], f"{p}/key_positions/Unsqueeze")
    query_col = b.op("Unsqueeze", [query_pos, b.const([1])], f"{p}/query_positions/Unsqueeze")
    causal = b.op("LessOrEqual", [key_row, query_col], f"{p}/causal/LessOrEqual")
    keep = b.op("Cast", ["attention_mask"], f"{p}/padding/Cast", to=TensorProto.BOOL)
    keep = b.op("Unsqueeze", [keep, b.const([1, 2, 3])], f"{p}/padding/Unsqueeze")
    return b.op("And", [causal, keep], f"{p}/And")


def split_heads(b: GraphBuilder, x: str, heads: int, head_dim: int, prefix: str) -> str:
    """[B, S, heads * D] -> [B, heads, S, D]."""
    x = b.op("Reshape", [x, b.const([0, 0, heads, head_dim])], f"{prefix}/Reshape")
    return b.op("Transpose", [x], f"{prefix}/Transpose", perm=[0, 2, 1, 3])


def apply_rope(b: GraphBuilder, x: str, rope: tuple[str, str], head_dim: int, prefix: str) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1)."""
    cos, sin = rope
    half, axis = head_dim // 2, b.const([3])
    first = b.op("Slice", [x, b.const([0]), b.const([half]), axis], f"{prefix}/Slice")
    second = b.op("Slice", [x, b.const([half]), b.const([head_dim]), axis], f"{prefix}/Slice_1")
    negated = b.op("Neg", [second], f"{prefix}/Neg")
    rotated = b.op("Concat", [negated, first], f"{prefix}/Concat", axis=-1)
    x_cos = b.op("Mul", [x, cos], f"{prefix}/Mul")
    rotated_sin = b.op("Mul", [rotated, sin], f"{prefix}/Mul_1")
    return b.op("Add", [x_cos, rotated_sin], f"{prefix}/Add")


def attention_core(
    b: GraphBuilder, config: LlamaConfig, q: str, k: str, v: str, mask: str, prefix: str
) -> str:
    """softmax(q k^T / sqrt(D) masked) v with K/V broadcast over query groups.

    q [B, H, S, D], k and v [B, KV, T, D] -> [B, S, H * D].
    """
    kv, groups, d = config.num_kv_heads, config.kv_groups, config.head_dim
    scaled = b.op("Mul", [q, b.const(d**-0.5, np.float32)], f"{prefix}/scale/Mul")
    grouped = b.op(
        "Reshape", [scaled, b.const([0, kv, groups, -1, d])], f"{prefix}/q_groups/Reshape"
    )
    k_t = b.op("Transpose", [k], f"{prefix}/k/Transpose", perm=[0, 1, 3, 2])
    k_t = b.op("Unsqueeze", [k_t, b.const([2])], f"{prefix}/k/Unsqueeze")
    scores = b.op("MatMul", [grouped, k_t], f"{prefix}/scores/MatMul")
    masked = b.op(
        "Where", [mask, scores, b.const(MASKED_SCORE, np.float32)], f"{prefix}/mask/Where"
    )
    probs = b.op("Softmax", [masked], f"{prefix}/Softmax", axis=-1)
    v_g = b.op("Unsqueeze", [v, b.const([2])], f"{prefix}/v/Unsqueeze")
    context = b.op("MatMul", [probs, v_g], f"{prefix}/context/MatMul")
    context = b.op(
        "Reshape", [context, b.const([0, config.num_heads, -1, d])], f"{prefix}/context/Reshape"
    )
    context = b.op("Transpose", [context], f"{prefix}/context/Transpose", perm=[0, 2, 1, 3])
    merged = [0, 0, config.num_heads * d]
    return b.op("Reshape", [context, b.const(merged)], f"{prefix}/context/Reshape_1")


def self_attention(
    b: GraphBuilder, config: LlamaConfig, weights: dict, x: str, layer: int, shared: dict
) -> str:
    """One layer's attention block; writes present.N.key / present.N.value."""
    p, w = f"/model/layers.{layer}/self_attn", f"model.layers.{layer}.self_attn"
    q = linear(b, x, weights, f"{w}.q_proj.weight", f"{p}/q_proj")
    k = linear(b, x, weights, f"{w}.k_proj.weight", f"{p}/k_proj")
    v = linear(b, x, weights, f"{w}.v_proj.weight", f"{p}/v_proj")
    q = split_heads(b, q, config.num_heads, config.head_dim, f"{p}/q_heads")
    k = split_heads(b, k, config.num_kv_heads, config.head_dim, f"{p}/k_heads")
    v = split_heads(b, v, config.num_kv_heads, config.head_dim, f"{p}/v_heads")
    q = apply_rope(b, q, shared["rope"], config.head_dim, f"{p}/q_rotary")
    k = apply_rope(b, k, shared["rope"], config.head_dim, f"{p}/k_rotary")
    past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
    k = b.op("Concat", [past_k, k], f"{p}/k_cache/Concat", output=f"present.{layer}.key", axis=2)
    v = b.op("Concat", [past_v, v], f"{p}/v_cache/Concat", output=f"present.{layer}.value", axis=2)
    context = attention_core(b, config, q, k, v, shared["mask"], p)
    return linear(b, context, weights, f"{w}.o_proj.weight", f"{p}/o_proj")


def mlp(b: GraphBuilder, weights: dict, x: str, layer: int) -> str:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    p, w = f"/model/layers.{layer}/mlp", f"model.layers.{layer}.mlp"
    gate = linear(b, x, weights, f"{w}.gate_proj.weight", f"{p}/gate_proj")
    up = linear(b, x, weights, f"{w}.up_proj.weight", f"{p}/up_proj")
    sigmoid = b.op("Sigmoid", [gate], f"{p}/act_fn/Sigmoid")
    silu = b.op("Mul", [gate, sigmoid], f"{p}/act_fn/Mul")
    hidden = b.op("Mul", [silu, up], f"{p}/Mul")
    return linear(b, hidden, weights, f"{w}.down_proj.weight", f"{p}/down_proj")


def decoder_layer(
    b: GraphBuilder, config: LlamaConfig, weights: dict, x: str, layer: int, shared: dict
) -> str:
    p, w = f"/model/layers.{layer}", f"model.layers.{layer}"
    eps = config.rms_eps
    normed = rms_norm(b, x, weights, f"{w}.input_layernorm.weight", f"{p}/input_layernorm", eps)
    attn = self_attention(b, config, weights, normed, layer, shared)
    x = b.op("Add", [x, attn], f"{p}/Add")
    name = f"{w}.post_attention_layernorm.weight"
    normed = rms_norm(b, x, weights, name, f"{p}/post_attention_layernorm", eps)
    return b.op("Add", [x, mlp(b, weights, normed, layer)], f"{p}/Add_1")


def lm_head(
    b: GraphBuilder, config: LlamaConfig, x: str, weights: dict, embedding: str,
    scales: str | None, last_only: bool = False,
) -> str:
    """Logits -> [B, S, V]: from the model's own head (`lm_head.weight`,
    a linear layer), or from the tied embedding matrix: Gemm(x, E, transB),
    or MatMulNBits over an 8-bit E and its `scales`. `last_only`: [B, 1, V],
    the last position's alone (the next token is drawn from it; a prompt of
    250 tokens then costs the head one row, not 250)."""
    p = "/lm_head"
    if last_only:
        end = b.const([np.iinfo(np.int64).max])
        x = b.op("Slice", [x, b.const([-1]), end, b.const([1])], f"{p}/last/Slice")
    if LM_HEAD in weights:
        logits = linear(b, x, weights, LM_HEAD, p)
        return b.op("Identity", [logits], f"{p}/Identity", output="logits")
    rows = b.op("Reshape", [x, b.const([-1, config.hidden_size])], f"{p}/Reshape")
    if scales is None:
        flat = b.op("Gemm", [rows, embedding], f"{p}/Gemm", transB=1)
    else:
        flat = q8_head(b, rows, embedding, scales, weights[embedding], p)
    if last_only:
        return b.op("Unsqueeze", [flat, b.const([1])], f"{p}/Unsqueeze", output="logits")
    batch_seq = b.op("Shape", ["input_ids"], f"{p}/Shape")
    shape = b.op("Concat", [batch_seq, b.const([config.vocab_size])], f"{p}/Concat", axis=0)
    return b.op("Reshape", [flat, shape], f"{p}/Reshape_1", output="logits")


def build_model(
    config: LlamaConfig, weights: dict[str, np.ndarray], fused: bool = False,
    nbits_accuracy: int = NBITS_ACCURACY,
) -> onnx.ModelProto:
    """The whole decoder; `weights` uses Hugging Face names and layouts.
    `fused`: with onnxruntime's fused operators (see `onnx_fused`), and
    logits of the last position only. `nbits_accuracy`: MatMulNBits'
    accuracy level (0: float32 activations, exact up to rounding)."""
    b = GraphBuilder(nbits_accuracy)
    name = "model.embed_tokens.weight"
    if isinstance(weights[name], Q8Weight):
        x, scales = q8_embedding(b, config.hidden_size, weights[name], name)
        embedding = name
    else:
        embedding, scales = b.weight(name, weights[name]), None
        x = b.op("Gather", [embedding, "input_ids"], "/model/embed_tokens/Gather", axis=0)
    if fused:
        from onnx_fused import attention_inputs, fused_final_norm, fused_layers, rotary_caches

        shared = {"rotary": rotary_caches(b, config)}
        shared["attention"] = attention_inputs(b)
        delta, residual = fused_layers(b, config, weights, x, shared)
        x = fused_final_norm(b, config, weights, delta, residual)
    else:
        shared = {"rope": rotary_tables(b, config), "mask": attention_mask(b)}
        for layer in range(config.num_layers):
            x = decoder_layer(b, config, weights, x, layer, shared)
        x = rms_norm(b, x, weights, "model.norm.weight", "/model/norm", config.rms_eps)
    lm_head(b, config, x, weights, embedding, scales, last_only=fused)
    initializers = [numpy_helper.from_array(array, name) for name, array in b.initializers.items()]
    graph = helper.make_graph(
        b.nodes, "llama", graph_inputs(config), graph_outputs(config, fused), initializers
    )
    opsets = [helper.make_opsetid("", OPSET)]
    if any(n.domain == MS_DOMAIN for n in b.nodes):
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    props = {STATE_PAIRS_KEY: json.dumps(state_pairs(config))}
    if fused:  # GroupQueryAttention appends at each row's length (see onnx_fused)
        props[PADDING_KEY] = "right"
    helper.set_model_props(model, props)
    return model

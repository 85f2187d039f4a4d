//! A layer's attention: q, k and v as one product, RMS norms of each
//! head's q and k where the family has them, then com.microsoft
//! `GroupQueryAttention`, which turns q and k by RoPE at `position_ids`
//! from cos/sin tables (llama.cpp's interleaved pairs or NEOX halves, over
//! the GGUF's own row order), appends k and v to the cache at each row's
//! own length (`seqlens_k` from the attention mask) and attends, within
//! the layer's window and under its soft cap where it has them.

use tessera_common::onnx::ElemType;

use super::linear::{linear, packed_linear, stacked_linear};
use super::norm::norm;
use super::weights::Layer;
use super::{Attr, GraphBuilder, MS_DOMAIN};
use crate::config::{DecoderConfig, RopeScaling, RopeStyle, RopeTable};

/// The most positions the RoPE tables cover (a model trained for more is
/// served at most this many: 32,768 × head_dim 128 is 16 MiB of tables).
pub const MAX_POSITIONS: usize = 32_768;

/// What every layer's attention reads besides its own weights.
pub struct Shared {
    /// cos and sin tables, `[positions, rope dims / 2]`, of the global
    /// layers and (where they differ) of the local ones.
    global: (String, String),
    local: Option<(String, String)>,
    /// Each row's length less one (`seqlens_k`, int32 `[batch]`) and the
    /// mask's width (int32 scalar).
    lengths: (String, String),
}

impl Shared {
    pub fn new(b: &mut GraphBuilder, c: &DecoderConfig, freqs: Option<&[f32]>) -> Shared {
        let global = rotary_tables(b, c, &c.rope.global, freqs, "model.rotary_emb");
        let local = c
            .rope
            .local
            .as_ref()
            .map(|t| rotary_tables(b, c, t, freqs, "model.rotary_emb_local"));
        Shared {
            global,
            local,
            lengths: attention_lengths(b),
        }
    }
}

/// cos and sin of each position's angles, as llama.cpp computes them
/// (ggml_rope_cache_init): angle_i = p · scale · base^(−2i/d), the powers
/// by repeated float32 products, each divided by its frequency factor
/// (Llama 3's, LongRoPE's), times the attention factor.
fn rotary_tables(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    table: &RopeTable,
    freqs: Option<&[f32]>,
    name: &str,
) -> (String, String) {
    let half = c.rope.dims / 2;
    let positions = c.context_length.min(MAX_POSITIONS);
    let scale = match table.scaling {
        RopeScaling::None => 1.0f32,
        RopeScaling::Linear(f) => 1.0 / f,
    };
    let m = c.rope.attn_factor;
    let step = table.base.powf(-2.0 / c.rope.dims as f32);
    let (mut cos, mut sin) = (
        Vec::with_capacity(positions * half),
        Vec::with_capacity(positions * half),
    );
    for p in 0..positions {
        let mut theta = p as f32;
        for i in 0..half {
            let factor = freqs.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
            let angle = scale * (theta / factor);
            cos.push(angle.cos() * m);
            sin.push(angle.sin() * m);
            theta *= step;
        }
    }
    let cos = b.floats(&format!("{name}.cos_cache"), &[positions, half], &cos);
    let sin = b.floats(&format!("{name}.sin_cache"), &[positions, half], &sin);
    (cos, sin)
}

/// `seqlens_k` (each row's attention-mask sum less one) and the mask's
/// width: a row's padding is after its own positions, so the attention
/// appends the new position at the row's own length and reads only that
/// many.
fn attention_lengths(b: &mut GraphBuilder) -> (String, String) {
    let p = "/model/attn_lengths";
    let axis = b.ints(&[1]);
    let sums = b.op(
        "ReduceSum",
        &["attention_mask", &axis],
        &format!("{p}/ReduceSum"),
        &[Attr::Int("keepdims", 0)],
    );
    let int32 = Attr::Int("to", ElemType::INT32.0 as i64);
    let sums = b.op("Cast", &[&sums], &format!("{p}/Cast"), &[int32]);
    let one = b.scalar(ElemType::INT32, 1.0);
    let seqlens = b.op("Sub", &[&sums, &one], &format!("{p}/seqlens/Sub"), &[]);
    let total = b.op(
        "Shape",
        &["attention_mask"],
        &format!("{p}/total/Shape"),
        &[Attr::Int("start", 1), Attr::Int("end", 2)],
    );
    let int32 = Attr::Int("to", ElemType::INT32.0 as i64);
    let total = b.op("Cast", &[&total], &format!("{p}/total/Cast"), &[int32]);
    let axis0 = b.ints(&[0]);
    let total = b.op(
        "Squeeze",
        &[&total, &axis0],
        &format!("{p}/total/Squeeze"),
        &[],
    );
    (seqlens, total)
}

/// q, k and v, packed as one `[batch, seq, q + 2 kv]` tensor, or three
/// where q and k are normed per head first.
fn projections(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    layer: &Layer,
    x: &str,
    (p, w): (&str, &str),
) -> Vec<String> {
    let name = format!("{w}.qkv_proj.weight");
    let prefix = format!("{p}/qkv_proj");
    let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) else {
        return vec![packed_linear(
            b,
            x,
            &layer.qkv,
            &layer.qkv_bias,
            &name,
            &prefix,
        )];
    };
    let mut qkv = stacked_linear(b, x, &layer.qkv, &name, &prefix);
    for (i, (heads, weight, n)) in [(c.heads, qn, "q_norm"), (c.kv_heads, kn, "k_norm")]
        .into_iter()
        .enumerate()
    {
        let mut y = qkv[i].clone();
        if let Some(bias) = &layer.qkv_bias[i] {
            let bias = b.floats(&format!("{w}.{i}.bias"), &[bias.len()], bias);
            y = b.op("Add", &[&y, &bias], &format!("{p}/{n}/bias/Add"), &[]);
        }
        let heads_shape = b.ints(&[0, 0, heads as i64, c.head_dim as i64]);
        let y = b.op(
            "Reshape",
            &[&y, &heads_shape],
            &format!("{p}/{n}/Reshape"),
            &[],
        );
        let normed = norm(
            b,
            &y,
            (&format!("{w}.{n}.weight"), weight),
            &format!("{p}/{n}/SimplifiedLayerNormalization"),
            c.rms_eps,
        );
        let flat = b.ints(&[0, 0, (heads * c.head_dim) as i64]);
        qkv[i] = b.op(
            "Reshape",
            &[&normed, &flat],
            &format!("{p}/{n}/Reshape_1"),
            &[],
        );
    }
    if let Some(bias) = &layer.qkv_bias[2] {
        let bias = b.floats(&format!("{w}.2.bias"), &[bias.len()], bias);
        qkv[2] = b.op("Add", &[&qkv[2], &bias], &format!("{p}/v/bias/Add"), &[]);
    }
    qkv
}

/// One layer's attention, its output projected back to the hidden size.
pub fn attention(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    layer: &Layer,
    x: &str,
    l: usize,
    shared: &Shared,
) -> String {
    let (p, w) = (
        format!("/model/layers.{l}/self_attn"),
        format!("model.layers.{l}.self_attn"),
    );
    let qkv = projections(b, c, layer, x, (&p, &w));
    let local = c.windows[l].is_some() && shared.local.is_some();
    let (cos, sin) = match (&shared.local, local) {
        (Some(t), true) => t,
        _ => &shared.global,
    };
    let (seqlens, total) = &shared.lengths;
    let (past_k, past_v) = (
        format!("past_key_values.{l}.key"),
        format!("past_key_values.{l}.value"),
    );
    let context = format!("{p}/GroupQueryAttention/output_0");
    let (present_k, present_v) = (format!("present.{l}.key"), format!("present.{l}.value"));
    let interleaved = i64::from(c.rope.style == RopeStyle::Interleaved);
    let mut attrs = vec![
        Attr::Int("num_heads", c.heads as i64),
        Attr::Int("kv_num_heads", c.kv_heads as i64),
        Attr::Int("do_rotary", 1),
        Attr::Int("rotary_interleaved", interleaved),
    ];
    if let Some(scale) = c.attention_scale {
        attrs.push(Attr::Float("scale", scale));
    }
    if let Some(cap) = c.attention_cap {
        attrs.push(Attr::Float("softcap", cap));
    }
    if let Some(window) = c.windows[l] {
        // onnxruntime's window holds the position itself (measured against
        // numpy's masked attention: a_declared_sliding_window_is_honoured).
        attrs.push(Attr::Int("local_window_size", window as i64));
    }
    let (q, k, v) = match &qkv[..] {
        [q, k, v] => (q.as_str(), k.as_str(), v.as_str()),
        [packed, ..] => (packed.as_str(), "", ""),
        [] => unreachable!("projections give q, k and v"),
    };
    b.node(
        "GroupQueryAttention",
        MS_DOMAIN,
        &[
            q,
            k,
            v,
            &past_k,
            &past_v,
            seqlens,
            total,
            cos,
            sin,
            "position_ids",
        ],
        &format!("{p}/GroupQueryAttention"),
        &[&context, &present_k, &present_v],
        &attrs,
    );
    linear(
        b,
        &context,
        &layer.o,
        layer.o_bias.as_deref(),
        &format!("{w}.o_proj.weight"),
        &format!("{p}/o_proj"),
    )
}

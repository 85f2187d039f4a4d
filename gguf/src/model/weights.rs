//! Every weight of a decoder, by llama.cpp's tensor names: what a family
//! has is read where the file has it (a fused `attn_qkv` or three
//! matrices, q/k norms, biases, Gemma's post-norms, Phi-3's fused gate and
//! up, experts), so one reader serves every family.

use bytes::Bytes;

use super::tensors::{ExpertTensor, Tensors};
use crate::config::DecoderConfig;
use crate::graph::weights::{Dense, ExpertMatrices, Experts, Ffn, Layer, QkvBias, Weights};
use crate::quant::{Joined, Native};
use crate::GgufError;

/// The decoder's weights, and the context its RoPE serves (LongRoPE's
/// short factors serve the original context only).
pub(super) fn read(t: &Tensors<'_, '_>, c: &DecoderConfig) -> Result<(Weights, usize), GgufError> {
    let h = c.hidden;
    let embedding = t.embedding(h)?;
    let mut layers = Vec::with_capacity(c.layers);
    for l in 0..c.layers {
        tracing::debug!(layer = l, "reading");
        layers.push(layer(t, c, l)?);
    }
    let output_norm = t.required_vector("output_norm.weight", h)?;
    let output = match t.info("output.weight")? {
        Some(info) => Some(t.matrix_of(info, embedding.rows(), h)?),
        None => None,
    };
    let half = c.rope.dims / 2;
    let llama3 = t.vector("rope_freqs.weight", half)?;
    let short = t.vector("rope_factors_short.weight", half)?;
    let long = t.vector("rope_factors_long.weight", half)?;
    let mut context = c.context_length;
    if long.is_some() && long != short {
        // llama.cpp takes the long factors only for a context beyond the
        // original one; Tessera serves the original context with the short.
        context = context.min(c.rope.original_context);
    }
    let weights = Weights {
        embedding,
        layers,
        output_norm,
        output,
        rope_freqs: llama3.or(short),
    };
    Ok((weights, context))
}

fn layer(t: &Tensors<'_, '_>, c: &DecoderConfig, l: usize) -> Result<Layer, GgufError> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let h = c.hidden;
    let q_dim = c.heads * c.head_dim;
    let (qkv, qkv_bias) = attention_inputs(t, c, l)?;
    let ffn = match &c.experts {
        Some(_) => Ffn::Experts(Box::new(experts(t, c, l)?)),
        None => Ffn::Dense(Box::new(dense(t, (h, c.ffn), &|s| n(s), "")?)),
    };
    Ok(Layer {
        attn_norm: t.required_vector(&n("attn_norm.weight"), h)?,
        qkv,
        qkv_bias,
        q_norm: t.vector(&n("attn_q_norm.weight"), c.head_dim)?,
        k_norm: t.vector(&n("attn_k_norm.weight"), c.head_dim)?,
        o: t.matrix(&n("attn_output.weight"), h, q_dim)?,
        o_bias: t.vector(&n("attn_output.bias"), h)?,
        post_attn_norm: t.vector(&n("post_attention_norm.weight"), h)?,
        ffn_norm: t.required_vector(&n("ffn_norm.weight"), h)?,
        ffn,
        post_ffn_norm: t.vector(&n("post_ffw_norm.weight"), h)?,
    })
}

/// q, k and v: a fused `attn_qkv` (Phi-3) or three matrices, and their
/// biases (Qwen 2).
fn attention_inputs(
    t: &Tensors<'_, '_>,
    c: &DecoderConfig,
    l: usize,
) -> Result<(Joined, QkvBias), GgufError> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (h, q_dim, kv_dim) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let rows = [q_dim, kv_dim, kv_dim];
    if let Some(info) = t.info(&n("attn_qkv.weight"))? {
        let fused = t.matrix_of(info, q_dim + 2 * kv_dim, h)?;
        let bias = match t.vector(&n("attn_qkv.bias"), q_dim + 2 * kv_dim)? {
            Some(b) => {
                let (q, rest) = b.split_at(q_dim);
                let (k, v) = rest.split_at(kv_dim);
                [Some(q.to_vec()), Some(k.to_vec()), Some(v.to_vec())]
            }
            None => separate_biases(t, c, l)?,
        };
        return Ok((Joined::fused(fused, rows.to_vec()), bias));
    }
    let qkv = Joined::new(vec![
        t.matrix(&n("attn_q.weight"), q_dim, h)?,
        t.matrix(&n("attn_k.weight"), kv_dim, h)?,
        t.matrix(&n("attn_v.weight"), kv_dim, h)?,
    ]);
    Ok((qkv, separate_biases(t, c, l)?))
}

fn separate_biases(t: &Tensors<'_, '_>, c: &DecoderConfig, l: usize) -> Result<QkvBias, GgufError> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (q_dim, kv_dim) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    Ok([
        t.vector(&n("attn_q.bias"), q_dim)?,
        t.vector(&n("attn_k.bias"), kv_dim)?,
        t.vector(&n("attn_v.bias"), kv_dim)?,
    ])
}

/// A gated feed-forward of `ffn_{gate,up,down}{suffix}` (`_shexp`: a
/// shared expert), or Phi-3's `ffn_up` of gate and up rows.
fn dense(
    t: &Tensors<'_, '_>,
    (h, ffn): (usize, usize),
    n: &dyn Fn(&str) -> String,
    suffix: &str,
) -> Result<Dense, GgufError> {
    let name = |s: &str| n(&format!("{s}{suffix}.weight"));
    let gate_up = match t.info(&name("ffn_gate"))? {
        Some(gate) => {
            let gate = t.matrix_of(gate, ffn, h)?;
            Joined::new(vec![gate, t.matrix(&name("ffn_up"), ffn, h)?])
        }
        None => Joined::fused(t.matrix(&name("ffn_up"), 2 * ffn, h)?, vec![ffn, ffn]),
    };
    Ok(Dense {
        gate_up,
        down: t.matrix(&name("ffn_down"), h, ffn)?,
    })
}

/// A layer's experts: the router, the experts' matrices (the file's
/// blocks where Tessera has kernels for all three, else one feed-forward
/// per expert) and a shared expert where the family has one.
fn experts(t: &Tensors<'_, '_>, c: &DecoderConfig, l: usize) -> Result<Experts, GgufError> {
    let Some(e) = &c.experts else {
        unreachable!("called for a mixture of experts")
    };
    let n = |s: &str| format!("blk.{l}.{s}");
    let (h, f, count) = (c.hidden, e.ffn, e.count);
    let router = t.matrix(&n("ffn_gate_inp.weight"), count, h)?;
    let missing = |s: &str| GgufError::Tensor {
        name: n(s),
        reason: "missing".into(),
    };
    let down = t
        .experts(&n("ffn_down_exps.weight"), (count, h, f))?
        .ok_or_else(|| missing("ffn_down_exps.weight"))?;
    let gate_up = match t.experts(&n("ffn_gate_up_exps.weight"), (count, 2 * f, h))? {
        Some(both) => vec![both],
        None => vec![
            t.experts(&n("ffn_gate_exps.weight"), (count, f, h))?
                .ok_or_else(|| missing("ffn_gate_exps.weight"))?,
            t.experts(&n("ffn_up_exps.weight"), (count, f, h))?
                .ok_or_else(|| missing("ffn_up_exps.weight"))?,
        ],
    };
    let native = t.native
        && gate_up
            .iter()
            .chain([&down])
            .all(|x| crate::kernels::has_kernel(x.ty));
    let matrices = if native {
        native_experts(&gate_up, &down, (count, f, h))?
    } else {
        each_expert(t, &gate_up, &down, (count, f, h))?
    };
    gate_up.iter().chain([&down]).for_each(|x| t.done(x.info));
    let shared = match e.shared_ffn {
        Some(fs) => Some((
            dense(t, (h, fs), &n, "_shexp")?,
            t.required_vector(&n("ffn_gate_inp_shexp.weight"), h)?,
        )),
        None => None,
    };
    Ok(Experts {
        router,
        matrices,
        shared,
    })
}

/// The experts' blocks: gate and up interleaved per expert (each expert's
/// gate rows, then its up rows: one product for both) where they are of
/// one type, and down.
fn native_experts(
    gate_up: &[ExpertTensor<'_>],
    down: &ExpertTensor<'_>,
    (count, f, h): (usize, usize, usize),
) -> Result<ExpertMatrices, GgufError> {
    let blocks = |parts: &[&[u8]], ty, rows: usize, cols: usize| {
        let data: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        Native {
            ty,
            rows,
            cols,
            data: Bytes::from(data),
        }
    };
    let gate_up = match gate_up {
        [both] => vec![blocks(&both.parts, both.ty, count * 2 * f, h)],
        [gate, up] if gate.ty == up.ty => {
            let parts: Vec<&[u8]> = (0..count)
                .flat_map(|e| [gate.parts[e], up.parts[e]])
                .collect();
            vec![blocks(&parts, gate.ty, count * 2 * f, h)]
        }
        _ => gate_up
            .iter()
            .map(|x| blocks(&x.parts, x.ty, count * f, h))
            .collect(),
    };
    for n in gate_up.iter() {
        crate::kernels::Blocks::new(n.ty, n.rows, n.cols, &n.data).map_err(|e| {
            GgufError::Tensor {
                name: "ffn_gate_exps/ffn_up_exps".into(),
                reason: e.to_string(),
            }
        })?;
    }
    Ok(ExpertMatrices::Native {
        gate_up,
        down: blocks(&down.parts, down.ty, count * h, f),
    })
}

/// One gated feed-forward per expert.
fn each_expert(
    t: &Tensors<'_, '_>,
    gate_up: &[ExpertTensor<'_>],
    down: &ExpertTensor<'_>,
    (count, f, h): (usize, usize, usize),
) -> Result<ExpertMatrices, GgufError> {
    (0..count)
        .map(|e| {
            let gate_up = match gate_up {
                [both] => Joined::fused(t.expert_weight(both, e, (2 * f, h))?, vec![f, f]),
                _ => Joined::new(
                    gate_up
                        .iter()
                        .map(|x| t.expert_weight(x, e, (f, h)))
                        .collect::<Result<_, _>>()?,
                ),
            };
            Ok(Dense {
                gate_up,
                down: t.expert_weight(down, e, (h, f))?,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ExpertMatrices::Each)
}

//! A decoder of any family read as onnxruntime's fused operators, one node
//! where a plain graph has tens (SmolLM2-135M: ~1,100 nodes a step instead
//! of ~2,500, 1.8× faster on one thread):
//!
//! - RMS norms are com.microsoft `SkipSimplifiedLayerNormalization` (the
//!   residual add and the norm in one node; standard ops for the first,
//!   which has no residual yet; `SimplifiedLayerNormalization` for Gemma's
//!   post-norms);
//! - the attention (`super::attention`) is one `GroupQueryAttention`
//!   over q/k/v from one product;
//! - the feed-forward (`super::ffn`) is gate and up in one product, or a
//!   mixture of experts;
//! - the logits are the last position's (`[batch, 1, vocab]`): a prompt
//!   costs the head one row, not one per position; a cache row's padding
//!   is after its positions (metadata `tessera.padding = right`).

use tessera_common::onnx::proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto};
use tessera_common::onnx::{tensor_info, ElemType};

use super::attention::{attention, Shared};
use super::embedding::{self, Table};
use super::ffn::feed_forward;
use super::linear::linear;
use super::norm::{norm, rms_norm, skip_norm};
use super::weights::{Layer, Weights};
use super::{GraphBuilder, MS_DOMAIN};
use crate::config::DecoderConfig;
use crate::quant::Weight;

pub use super::attention::MAX_POSITIONS;
use tessera_common::graph::LAYER_PREFIX_KEY;

pub const OPSET: i64 = 17;
pub const IR_VERSION: i64 = 8;
pub const PRODUCER: &str = "tessera-gguf";
/// Metadata listing `[present output, past input]` for every cache tensor.
pub const STATE_PAIRS_KEY: &str = "tessera.state_pairs";
/// Where a decode batch pads each row's cache (`right`: after its
/// positions).
pub const PADDING_KEY: &str = "tessera.padding";
/// The whole decoder; `accuracy_level` is `MatMulNBits`' (4: int8
/// activations, 0: float32); `ggml_rounding`: activations rounded where
/// llama.cpp's CPU backend rounds them (beside Tessera's kernels).
/// Each layer's weights are dropped once its nodes are made (the
/// initializers share their bytes), so building holds about one copy.
pub fn build(
    config: &DecoderConfig,
    weights: Weights,
    (accuracy_level, ggml_rounding): (i64, bool),
) -> ModelProto {
    let Weights {
        embedding,
        layers: stack,
        output_norm,
        output,
        rope_freqs,
    } = weights;
    let mut b = GraphBuilder::new(accuracy_level);
    b.ggml_rounding = ggml_rounding;
    let mut x = embedding::lookup(&mut b, &embedding, config.hidden);
    if config.family.scaled_embedding {
        // llama.cpp scales by sqrtf(n_embd) in float32.
        let scale = b.scalar(ElemType::FLOAT, (config.hidden as f32).sqrt().into());
        x = b.op("Mul", &[&x, &scale], "/model/embed_tokens/scale/Mul", &[]);
    }
    let shared = Shared::new(&mut b, config, rope_freqs.as_deref());
    let (delta, residual) = layers(&mut b, config, stack, &x, &shared);
    let (normed, _) = skip_norm(
        &mut b,
        (&delta, &residual),
        ("model.norm.weight", &output_norm),
        "/model/norm",
        config.rms_eps,
    );
    let vocab = output.as_ref().map_or(embedding.rows(), Weight::rows);
    head(&mut b, config, (&embedding, output.as_ref()), &normed);
    model(config, vocab, b)
}

fn model(config: &DecoderConfig, vocab: usize, b: GraphBuilder) -> ModelProto {
    use tessera_common::onnx::proto::GraphProto;
    let graph = GraphProto {
        node: b.nodes,
        name: Some(config.arch.clone()),
        initializer: b.initializers,
        input: graph_inputs(config),
        output: graph_outputs(config, vocab),
        ..Default::default()
    };
    let state_pairs: Vec<[String; 2]> = (0..config.layers)
        .flat_map(|l| {
            ["key", "value"].map(|k| {
                [
                    format!("present.{l}.{k}"),
                    format!("past_key_values.{l}.{k}"),
                ]
            })
        })
        .collect();
    let props = [
        (
            STATE_PAIRS_KEY,
            serde_json::to_string(&state_pairs).unwrap_or_default(),
        ),
        (PADDING_KEY, "right".to_string()),
        // Every node of layer N is named /model/layers.N/…: a pipeline's
        // stages hold whole layers.
        (LAYER_PREFIX_KEY, "/model/layers.".to_string()),
    ];
    let opset_import = opsets(&graph);
    ModelProto {
        ir_version: Some(IR_VERSION),
        producer_name: Some(PRODUCER.into()),
        graph: Some(graph),
        opset_import,
        metadata_props: props
            .into_iter()
            .map(|(k, v)| StringStringEntryProto {
                key: Some(k.into()),
                value: Some(v),
            })
            .collect(),
        ..Default::default()
    }
}

/// The default opset, onnxruntime's contrib domain, and Tessera's kernels'
/// domain where a node is of it.
fn opsets(graph: &tessera_common::onnx::proto::GraphProto) -> Vec<OperatorSetIdProto> {
    let import = |domain: &str, version| OperatorSetIdProto {
        domain: Some(domain.into()),
        version: Some(version),
    };
    let mut opsets = vec![import("", OPSET), import(MS_DOMAIN, 1)];
    if graph
        .node
        .iter()
        .any(|n| n.domain.as_deref() == Some(crate::kernels::DOMAIN))
    {
        opsets.push(import(crate::kernels::DOMAIN, 1));
    }
    opsets
}

/// A `ValueInfoProto` with symbolic (`String`) and fixed dimensions.
fn info(name: &str, elem: ElemType, dims: &[Dim]) -> tessera_common::onnx::proto::ValueInfoProto {
    use tessera_common::onnx::proto::tensor_shape_proto::{dimension::Value, Dimension};
    let mut v = tensor_info(name, elem.0, &[]);
    if let Some(tessera_common::onnx::proto::type_proto::Value::TensorType(t)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        let shape = t.shape.get_or_insert_with(Default::default);
        shape.dim = dims
            .iter()
            .map(|d| Dimension {
                denotation: None,
                value: Some(match d {
                    Dim::Named(s) => Value::DimParam(s.to_string()),
                    Dim::Fixed(n) => Value::DimValue(*n as i64),
                }),
            })
            .collect();
    }
    v
}

enum Dim {
    Named(&'static str),
    Fixed(usize),
}

fn graph_inputs(c: &DecoderConfig) -> Vec<tessera_common::onnx::proto::ValueInfoProto> {
    use Dim::*;
    let mut inputs = vec![
        info(
            "input_ids",
            ElemType::INT64,
            &[Named("batch_size"), Named("sequence_length")],
        ),
        info(
            "attention_mask",
            ElemType::INT64,
            &[Named("batch_size"), Named("total_sequence_length")],
        ),
        info(
            "position_ids",
            ElemType::INT64,
            &[Named("batch_size"), Named("sequence_length")],
        ),
    ];
    let past = [
        Named("batch_size"),
        Fixed(c.kv_heads),
        Named("past_sequence_length"),
        Fixed(c.head_dim),
    ];
    for l in 0..c.layers {
        for k in ["key", "value"] {
            inputs.push(info(
                &format!("past_key_values.{l}.{k}"),
                ElemType::FLOAT,
                &past,
            ));
        }
    }
    inputs
}

fn graph_outputs(
    c: &DecoderConfig,
    vocab: usize,
) -> Vec<tessera_common::onnx::proto::ValueInfoProto> {
    use Dim::*;
    let mut outputs = vec![info(
        "logits",
        ElemType::FLOAT,
        &[Named("batch_size"), Fixed(1), Fixed(vocab)],
    )];
    let present = [
        Named("batch_size"),
        Fixed(c.kv_heads),
        Named("total_sequence_length"),
        Fixed(c.head_dim),
    ];
    for l in 0..c.layers {
        for k in ["key", "value"] {
            outputs.push(info(&format!("present.{l}.{k}"), ElemType::FLOAT, &present));
        }
    }
    outputs
}

/// Every layer; the last block's output and the residual stream, for the
/// final norm to add.
fn layers(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    stack: Vec<Layer>,
    x: &str,
    shared: &Shared,
) -> (String, String) {
    let (mut residual, mut delta): (String, Option<String>) = (x.to_string(), None);
    for (l, layer) in stack.into_iter().enumerate() {
        let layer = &layer;
        let (p, w) = (format!("/model/layers.{l}"), format!("model.layers.{l}"));
        let norm_name = format!("{w}.input_layernorm.weight");
        let weight = (norm_name.as_str(), layer.attn_norm.as_slice());
        let p_norm = format!("{p}/input_layernorm");
        let normed = match &delta {
            None => rms_norm(b, &residual, weight, &p_norm, c.rms_eps),
            Some(d) => {
                let (n, r) = skip_norm(b, (d, &residual), weight, &p_norm, c.rms_eps);
                residual = r;
                n
            }
        };
        let attn = attention(b, c, layer, &normed, l, shared);
        let post = (p.as_str(), w.as_str(), "post_attention_norm");
        let attn = post_norm(b, c, &attn, layer.post_attn_norm.as_deref(), post);
        let norm_name = format!("{w}.post_attention_layernorm.weight");
        let (normed, r) = skip_norm(
            b,
            (&attn, &residual),
            (&norm_name, &layer.ffn_norm),
            &format!("{p}/post_attention_layernorm"),
            c.rms_eps,
        );
        residual = r;
        let y = feed_forward(b, c, &layer.ffn, &normed, l);
        let post = (p.as_str(), w.as_str(), "post_feedforward_norm");
        delta = Some(post_norm(b, c, &y, layer.post_ffn_norm.as_deref(), post));
    }
    (delta.unwrap_or_default(), residual)
}

/// `x` normed before its residual add, where the layer has such a norm.
fn post_norm(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    x: &str,
    weight: Option<&[f32]>,
    (p, w, what): (&str, &str, &str),
) -> String {
    match weight {
        Some(weight) => {
            let name = format!("{w}.{what}.weight");
            norm(b, x, (&name, weight), &format!("{p}/{what}"), c.rms_eps)
        }
        None => x.to_string(),
    }
}

/// The last position's logits, `[batch, 1, vocab]`.
fn head(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    (embedding, output): (&Table, Option<&Weight>),
    x: &str,
) {
    let p = "/lm_head";
    let (start, end, axis) = (b.ints(&[-1]), b.ints(&[i64::MAX]), b.ints(&[1]));
    let last = b.op(
        "Slice",
        &[x, &start, &end, &axis],
        &format!("{p}/last/Slice"),
        &[],
    );
    let mut logits = match output {
        Some(w) => linear(b, &last, w, None, "lm_head.weight", p),
        None => embedding::tied_head(b, &last, embedding, c.hidden, p),
    };
    if let Some(cap) = c.final_cap {
        // cap · tanh(logits / cap), as llama.cpp scales, tanh, scales.
        let inverse = b.scalar(ElemType::FLOAT, (1.0 / cap).into());
        let scaled = b.op(
            "Mul",
            &[&logits, &inverse],
            &format!("{p}/softcap/Mul"),
            &[],
        );
        let t = b.op("Tanh", &[&scaled], &format!("{p}/softcap/Tanh"), &[]);
        let cap = b.scalar(ElemType::FLOAT, cap.into());
        logits = b.op("Mul", &[&t, &cap], &format!("{p}/softcap/Mul_1"), &[]);
    }
    b.op_to(
        "Identity",
        &[&logits],
        &format!("{p}/Identity"),
        "logits",
        &[],
    );
}

//! A layer's feed-forward: a gated one, `down(act(gate(x)) · up(x))` with
//! the family's activation (SwiGLU, Gemma's GELU-tanh), or a mixture of
//! experts: a router's softmax, each token's top experts, their outputs
//! weighted and summed (and Qwen2-MoE's shared expert under its sigmoid
//! gate).

use tessera_common::onnx::ElemType;

use super::linear::{linear, native_blocks, stacked_linear};
use super::weights::{Dense, ExpertMatrices, Experts, Ffn};
use super::{Attr, GraphBuilder};
use crate::config::{Activation, DecoderConfig};
use crate::kernels;
use crate::quant::Native;

/// llama.cpp's floor under the sum of the chosen experts' weights when it
/// renormalizes them (float16's smallest normal).
const WEIGHTS_FLOOR: f64 = 6.103_515_625e-5;

/// The feed-forward of layer `l`.
pub fn feed_forward(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    ffn: &Ffn,
    x: &str,
    l: usize,
) -> String {
    let (p, w) = (
        format!("/model/layers.{l}/mlp"),
        format!("model.layers.{l}.mlp"),
    );
    match ffn {
        Ffn::Dense(d) => gated(b, c.family.activation, d, x, (&p, &w)),
        Ffn::Experts(e) => experts(b, c, e, x, (&p, &w)),
    }
}

/// `act(gate) · up`.
fn activate(b: &mut GraphBuilder, act: Activation, (gate, up): (&str, &str), p: &str) -> String {
    let a = match act {
        Activation::Silu => {
            let sigmoid = b.op("Sigmoid", &[gate], &format!("{p}/act_fn/Sigmoid"), &[]);
            b.op("Mul", &[gate, &sigmoid], &format!("{p}/act_fn/Mul"), &[])
        }
        Activation::GeluTanh if b.ggml_rounding => ggml_gelu(b, gate, &format!("{p}/act_fn")),
        Activation::GeluTanh => b.ms_op("FastGelu", &[gate], &format!("{p}/act_fn/FastGelu"), &[]),
    };
    b.op("Mul", &[&a, up], &format!("{p}/Mul"), &[])
}

/// GELU as llama.cpp's CPU backend computes it: its input rounded to
/// float16, looked up in a table of float16 results (so the output is
/// rounded to float16 too), except from 10 on, where it is the input.
fn ggml_gelu(b: &mut GraphBuilder, x: &str, p: &str) -> String {
    let f16 = |b: &mut GraphBuilder, x: &str, name: &str| {
        let half = b.op(
            "Cast",
            &[x],
            &format!("{name}/Cast"),
            &[Attr::Int("to", ElemType::FLOAT16.0 as i64)],
        );
        b.to_float(&half, &format!("{name}/Cast_1"))
    };
    let input = f16(b, x, &format!("{p}/in"));
    let gelu = b.ms_op("FastGelu", &[&input], &format!("{p}/FastGelu"), &[]);
    let table = f16(b, &gelu, &format!("{p}/out"));
    let ten = b.scalar(ElemType::FLOAT, 10.0);
    let large = b.op(
        "GreaterOrEqual",
        &[x, &ten],
        &format!("{p}/GreaterOrEqual"),
        &[],
    );
    b.op("Where", &[&large, x, &table], &format!("{p}/Where"), &[])
}

/// A gated feed-forward, gate and up in one product.
fn gated(
    b: &mut GraphBuilder,
    act: Activation,
    d: &Dense,
    x: &str,
    (p, w): (&str, &str),
) -> String {
    let outs = stacked_linear(
        b,
        x,
        &d.gate_up,
        &format!("{w}.gate_up_proj.weight"),
        &format!("{p}/gate_up"),
    );
    let hidden = activate(b, act, (&outs[0], &outs[1]), p);
    linear(
        b,
        &hidden,
        &d.down,
        None,
        &format!("{w}.down_proj.weight"),
        &format!("{p}/down_proj"),
    )
}

/// The chosen experts and their weights: `[.., used]` int64 ids and
/// float weights, and the router's probabilities `[.., experts]`.
struct Routing {
    ids: String,
    weights: String,
    probs: String,
}

fn route(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    e: &Experts,
    x: &str,
    (p, w): (&str, &str),
) -> Routing {
    let Some(rule) = &c.experts else {
        unreachable!("expert weights come with an experts config")
    };
    let logits = linear(
        b,
        x,
        &e.router,
        None,
        &format!("{w}.router.weight"),
        &format!("{p}/router"),
    );
    let probs = b.op(
        "Softmax",
        &[&logits],
        &format!("{p}/router/Softmax"),
        &[Attr::Int("axis", -1)],
    );
    let k = b.ints(&[rule.used as i64]);
    let (weights, ids) = (format!("{p}/TopK/output_0"), format!("{p}/TopK/output_1"));
    b.node(
        "TopK",
        "",
        &[&probs, &k],
        &format!("{p}/TopK"),
        &[&weights, &ids],
        &[Attr::Int("axis", -1)],
    );
    let mut weights = weights;
    if rule.normalized {
        let axis = b.ints(&[-1]);
        let sum = b.op(
            "ReduceSum",
            &[&weights, &axis],
            &format!("{p}/norm/ReduceSum"),
            &[Attr::Int("keepdims", 1)],
        );
        let floor = b.scalar(ElemType::FLOAT, WEIGHTS_FLOOR);
        let sum = b.op("Max", &[&sum, &floor], &format!("{p}/norm/Max"), &[]);
        weights = b.op("Div", &[&weights, &sum], &format!("{p}/norm/Div"), &[]);
    }
    if let Some(scale) = rule.scale {
        let s = b.scalar(ElemType::FLOAT, scale.into());
        weights = b.op("Mul", &[&weights, &s], &format!("{p}/scale/Mul"), &[]);
    }
    Routing {
        ids,
        weights,
        probs,
    }
}

fn experts(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    e: &Experts,
    x: &str,
    (p, w): (&str, &str),
) -> String {
    let routing = route(b, c, e, x, (p, w));
    let mut out = match &e.matrices {
        ExpertMatrices::Native { gate_up, down } => {
            native_experts(b, c, (gate_up, down), x, &routing, (p, w))
        }
        ExpertMatrices::Each(each) => every_expert(b, c, each, x, &routing, (p, w)),
    };
    if let Some((dense, gate_row)) = &e.shared {
        let (sp, sw) = (format!("{p}/shared_expert"), format!("{w}.shared_expert"));
        let y = gated(b, c.family.activation, dense, x, (&sp, &sw));
        let row = b.floats(&format!("{sw}.gate.weight"), &[gate_row.len(), 1], gate_row);
        let g = b.op("MatMul", &[x, &row], &format!("{sp}/gate/MatMul"), &[]);
        let g = b.op("Sigmoid", &[&g], &format!("{sp}/gate/Sigmoid"), &[]);
        let y = b.op("Mul", &[&y, &g], &format!("{sp}/gate/Mul"), &[]);
        out = b.op("Add", &[&out, &y], &format!("{p}/shared/Add"), &[]);
    }
    out
}

/// `MatMulExperts`: each token's chosen experts' rows of `n` (Tessera's
/// kernels), `[.., used, n.rows / experts]`.
fn expert_product(
    b: &mut GraphBuilder,
    x: &str,
    ids: &str,
    n: &Native,
    experts: usize,
    (name, prefix): (&str, &str),
) -> String {
    let blocks = native_blocks(b, n, name);
    let out = format!("{prefix}/GgmlMatMulExperts/output_0");
    b.node(
        kernels::MATMUL_EXPERTS,
        kernels::DOMAIN,
        &[x, ids, &blocks],
        &format!("{prefix}/GgmlMatMulExperts"),
        &[&out],
        &[
            Attr::Int("type", n.ty.0 as i64),
            Attr::Int("K", n.cols as i64),
            Attr::Int("N", (n.rows / experts) as i64),
            Attr::Int("experts", experts as i64),
        ],
    );
    out
}

fn native_experts(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    (gate_up, down): (&[Native], &Native),
    x: &str,
    r: &Routing,
    (p, w): (&str, &str),
) -> String {
    let count = c.experts.as_ref().map_or(1, |e| e.count);
    let product = |b: &mut GraphBuilder, x: &str, n: &Native, what: &str| {
        let (name, prefix) = (
            format!("{w}.experts.{what}.weight"),
            format!("{p}/experts/{what}"),
        );
        expert_product(b, x, &r.ids, n, count, (&name, &prefix))
    };
    let (gate, up) = match gate_up {
        [both] => {
            let y = product(b, x, both, "gate_up");
            let (g, u) = (
                format!("{p}/experts/Split/output_0"),
                format!("{p}/experts/Split/output_1"),
            );
            let split = format!("{p}/experts/Split");
            b.node(
                "Split",
                "",
                &[&y],
                &split,
                &[&g, &u],
                &[Attr::Int("axis", -1)],
            );
            (g, u)
        }
        [gate, up, ..] => (product(b, x, gate, "gate"), product(b, x, up, "up")),
        [] => unreachable!("experts have gate and up matrices"),
    };
    let hidden = activate(
        b,
        c.family.activation,
        (&gate, &up),
        &format!("{p}/experts"),
    );
    let y = product(b, &hidden, down, "down");
    let axis = b.ints(&[-1]);
    let weights = b.op(
        "Unsqueeze",
        &[&r.weights, &axis],
        &format!("{p}/experts/Unsqueeze"),
        &[],
    );
    let weighted = b.op(
        "Mul",
        &[&y, &weights],
        &format!("{p}/experts/weights/Mul"),
        &[],
    );
    let slots = b.ints(&[-2]);
    b.op(
        "ReduceSum",
        &[&weighted, &slots],
        &format!("{p}/experts/ReduceSum"),
        &[Attr::Int("keepdims", 0)],
    )
}

/// Every expert's output times its weight in the token's routing (0
/// unless chosen), summed: standard operators only.
fn every_expert(
    b: &mut GraphBuilder,
    c: &DecoderConfig,
    each: &[Dense],
    x: &str,
    r: &Routing,
    (p, w): (&str, &str),
) -> String {
    let zeros = b.op(
        "Sub",
        &[&r.probs, &r.probs],
        &format!("{p}/experts/zeros/Sub"),
        &[],
    );
    let dense = b.op(
        "ScatterElements",
        &[&zeros, &r.ids, &r.weights],
        &format!("{p}/experts/ScatterElements"),
        &[Attr::Int("axis", -1)],
    );
    let mut outputs = Vec::with_capacity(each.len());
    for (e, expert) in each.iter().enumerate() {
        let (ep, ew) = (format!("{p}/experts.{e}"), format!("{w}.experts.{e}"));
        let y = gated(b, c.family.activation, expert, x, (&ep, &ew));
        let (start, end, axis) = (b.ints(&[e as i64]), b.ints(&[e as i64 + 1]), b.ints(&[-1]));
        let weight = b.op(
            "Slice",
            &[&dense, &start, &end, &axis],
            &format!("{ep}/weight/Slice"),
            &[],
        );
        outputs.push(b.op("Mul", &[&y, &weight], &format!("{ep}/weight/Mul"), &[]));
    }
    let refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    b.op("Sum", &refs, &format!("{p}/experts/Sum"), &[])
}

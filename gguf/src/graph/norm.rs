//! RMS norms: `x / sqrt(mean(x²) + eps) · weight` over the last axis.

use tessera_common::onnx::ElemType;

use super::{Attr, GraphBuilder, MS_DOMAIN};

/// A norm's weight: its initializer's name and values.
pub type NormWeight<'a> = (&'a str, &'a [f32]);

/// The norm in standard operators (the first layer's: no residual to add
/// yet).
pub fn rms_norm(
    b: &mut GraphBuilder,
    x: &str,
    (name, weight): NormWeight,
    p: &str,
    eps: f32,
) -> String {
    let w = b.floats(name, &[weight.len()], weight);
    let square = b.op("Mul", &[x, x], &format!("{p}/Mul"), &[]);
    let mean = b.op(
        "ReduceMean",
        &[&square],
        &format!("{p}/ReduceMean"),
        &[Attr::Ints("axes", &[-1]), Attr::Int("keepdims", 1)],
    );
    let eps = b.scalar(ElemType::FLOAT, eps.into());
    let shifted = b.op("Add", &[&mean, &eps], &format!("{p}/Add"), &[]);
    let root = b.op("Sqrt", &[&shifted], &format!("{p}/Sqrt"), &[]);
    let one = b.scalar(ElemType::FLOAT, 1.0);
    let inverse = b.op("Div", &[&one, &root], &format!("{p}/Div"), &[]);
    let normed = b.op("Mul", &[x, &inverse], &format!("{p}/Mul_1"), &[]);
    b.op("Mul", &[&normed, &w], &format!("{p}/Mul_2"), &[])
}

/// The norm as onnxruntime's one node (`SimplifiedLayerNormalization`).
pub fn norm(
    b: &mut GraphBuilder,
    x: &str,
    (name, weight): NormWeight,
    p: &str,
    eps: f32,
) -> String {
    let w = b.floats(name, &[weight.len()], weight);
    b.op(
        "SimplifiedLayerNormalization",
        &[x, &w],
        p,
        &[Attr::Int("axis", -1), Attr::Float("epsilon", eps)],
    )
}

/// `(norm(x + residual), x + residual)` in one node.
pub fn skip_norm(
    b: &mut GraphBuilder,
    (x, residual): (&str, &str),
    (name, weight): NormWeight,
    p: &str,
    eps: f32,
) -> (String, String) {
    let w = b.floats(name, &[weight.len()], weight);
    let (normed, total) = (format!("{p}/output_0"), format!("{p}/output_3"));
    b.node(
        "SkipSimplifiedLayerNormalization",
        MS_DOMAIN,
        &[x, residual, &w],
        p,
        &[&normed, "", "", &total],
        &[Attr::Float("epsilon", eps)],
    );
    (normed, total)
}

//! Ops whose output has input 0's shape, and broadcasting ops.

use super::{broadcast, norm_axis, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::attr_i;

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Relu", SAME),
    ("LeakyRelu", SAME),
    ("Sigmoid", SAME),
    ("Tanh", SAME),
    ("Exp", SAME),
    ("Log", SAME),
    ("Sqrt", SAME),
    ("Neg", SAME),
    ("Abs", SAME),
    ("Cast", SAME),
    ("CastLike", SAME),
    ("Clip", SAME),
    ("HardSigmoid", SAME),
    ("HardSwish", SAME),
    ("Erf", SAME),
    ("Softmax", SAME),
    ("LogSoftmax", SAME),
    ("Identity", SAME),
    ("BatchNormalization", SAME),
    ("InstanceNormalization", SAME),
    ("Gelu", SAME),
    ("Elu", SAME),
    ("Selu", SAME),
    ("Softplus", SAME),
    ("Floor", SAME),
    ("Ceil", SAME),
    ("Round", SAME),
    ("Reciprocal", SAME),
    ("Sin", SAME),
    ("Cos", SAME),
    ("Not", SAME),
    ("Sign", SAME),
    ("PRelu", SAME),
    ("IsNaN", SAME),
    ("IsInf", SAME),
    ("Mish", SAME),
    ("Softsign", SAME),
    ("LRN", SAME),
    ("QuantizeLinear", SAME),
    ("DequantizeLinear", SAME),
    // Output and mask: both the input's shape.
    ("Dropout", Rule::All(|a| vec![a.input(0); 2])),
    ("LayerNormalization", Rule::All(layer_norm)),
    ("Add", BROADCAST),
    ("Sub", BROADCAST),
    ("Mul", BROADCAST),
    ("Div", BROADCAST),
    ("Pow", BROADCAST),
    ("Equal", BROADCAST),
    ("Less", BROADCAST),
    ("Greater", BROADCAST),
    ("LessOrEqual", BROADCAST),
    ("GreaterOrEqual", BROADCAST),
    ("And", BROADCAST),
    ("Or", BROADCAST),
    ("Xor", BROADCAST),
    ("Mod", BROADCAST),
    ("Max", BROADCAST),
    ("Min", BROADCAST),
    ("Sum", BROADCAST),
    ("Mean", BROADCAST),
    ("Where", BROADCAST),
];

/// Input 0's shape.
const SAME: Rule = Rule::First(|a| a.input(0));

/// Every input broadcast together.
const BROADCAST: Rule = Rule::First(|a| {
    let mut acc = a.input(0)?;
    for k in 1..a.node.input.len() {
        acc = broadcast(&acc, &a.input(k)?)?;
    }
    Some(acc)
});

/// Y like X; Mean and InvStdDev with the normalized axes kept as 1.
fn layer_norm(a: &ShapeArgs) -> Vec<Option<Vec<Dim>>> {
    let x = a.input(0);
    let stats = x.as_ref().and_then(|x| {
        let axis = norm_axis(attr_i(a.node, "axis").unwrap_or(-1), x.len())?;
        Some(
            x.iter()
                .enumerate()
                .map(|(i, d)| if i < axis { d.clone() } else { Dim::Known(1) })
                .collect::<Vec<_>>(),
        )
    });
    vec![x, stats.clone(), stats]
}

//! Folding rules: the value of an op's outputs from constant inputs, one
//! file per op family, each with a table from op type to its rule. A rule
//! returns `None` where it declines (an unsupported element type, an
//! attribute it does not handle, a division by zero): the node then stays.

mod elementwise;
mod reduce;
mod shape;

pub(crate) use shape::shape_range;

use super::value::Value;
use crate::onnx::attr::{attr_i, attr_ints};
use crate::onnx::proto::NodeProto;

/// What a rule sees: the node, its inputs' values (`None`: omitted
/// optional input) and the default-domain opset.
pub(crate) struct Args<'a> {
    pub node: &'a NodeProto,
    pub inputs: Vec<Option<&'a Value>>,
    pub opset: i64,
}

impl<'a> Args<'a> {
    /// Input `k`, present.
    pub fn input(&self, k: usize) -> Option<&'a Value> {
        self.inputs.get(k).copied().flatten()
    }

    pub fn int(&self, name: &str) -> Option<i64> {
        attr_i(self.node, name)
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        attr_ints(self.node, name).map(<[i64]>::to_vec)
    }

    /// Integers from attribute `name` (older opsets) or input `k` (newer).
    pub fn ints_from(&self, name: &str, k: usize) -> Option<Vec<i64>> {
        self.ints(name)
            .or_else(|| self.input(k).and_then(|v| v.as_ints()).map(<[i64]>::to_vec))
    }
}

/// A folding rule.
pub(crate) type Rule = fn(&Args) -> Option<Vec<Value>>;

/// Every folding rule, by op type.
pub(crate) fn rules() -> impl Iterator<Item = (&'static str, Rule)> {
    elementwise::RULES
        .iter()
        .chain(shape::RULES)
        .chain(reduce::RULES)
        .copied()
}

/// Every op type with a folding rule.
pub fn foldable_ops() -> impl Iterator<Item = &'static str> {
    rules().map(|(op, _)| op)
}

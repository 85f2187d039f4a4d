//! Values that are not dense tensors: sequences and optionals. The IR types
//! them by their elements (a `SequenceConstruct` of float tensors is typed
//! float), but they cannot leave the subgraph that makes them: the wire
//! carries tensors only (a plugin's `infer_values` takes and returns them,
//! for a graph run whole), so the planner refuses them at the graph's
//! inputs and outputs and keeps them inside one subgraph.

use std::collections::HashSet;

use super::{Graph, TensorId};
use crate::onnx::proto::type_proto;

/// Ops whose outputs are sequences of tensors.
pub const SEQUENCE_OPS: &[&str] = &[
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceErase",
    "SplitToSequence",
    "SequenceMap",
];

/// The op whose output is an optional.
pub const OPTIONAL_OP: &str = "Optional";

/// Ops whose outputs are what their first input is.
const PASS_THROUGH: &[&str] = &["Identity"];

impl Graph {
    /// The tensors of the graph that hold a sequence or an optional: made by
    /// a sequence or optional op, passed through `Identity`, or declared so
    /// (`value_info`, graph inputs and outputs).
    pub fn collections(&self) -> HashSet<TensorId> {
        let declared: HashSet<&str> = self
            .model()
            .graph
            .iter()
            .flat_map(|g| g.value_info.iter().chain(&g.input).chain(&g.output))
            .filter(|v| {
                let value = v.r#type.as_ref().and_then(|t| t.value.as_ref());
                matches!(
                    value,
                    Some(type_proto::Value::SequenceType(_) | type_proto::Value::OptionalType(_))
                )
            })
            .filter_map(|v| v.name.as_deref())
            .collect();
        let mut out = HashSet::new();
        for &id in self.topo_ops() {
            let node = self.node(id);
            let op = node.op_type.as_str();
            let passes = PASS_THROUGH.contains(&op)
                && node
                    .inputs
                    .first()
                    .copied()
                    .flatten()
                    .is_some_and(|t| out.contains(&t));
            for &t in node.outputs.iter().flatten() {
                if SEQUENCE_OPS.contains(&op)
                    || op == OPTIONAL_OP
                    || passes
                    || declared.contains(self.tensor(t).name.as_str())
                {
                    out.insert(t);
                }
            }
        }
        out
    }
}

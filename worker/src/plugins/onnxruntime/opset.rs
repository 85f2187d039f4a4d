//! Models at opset 22 handed to onnxruntime at opset 21 where it lacks an
//! opset-22 kernel.
//!
//! ONNX opset 22 changed no operator's meaning: the 47 operators it bumped
//! (RoiAlign, Conv, the pools, LSTM, the trigonometric ops, ...) only accept
//! bfloat16 (Dropout also float8) as well, with the same inputs, outputs,
//! attributes and defaults as at 21. onnxruntime 1.32 registers no
//! opset-22 kernel for some of them ([`NO_KERNEL_AT_22`]) while running
//! them at 21, so a model at 22 that uses one runs at 21: exactly the same
//! model for every type opset 21 accepts (onnxruntime's type check refuses
//! the others, never computes them).

use tessera_common::onnx::attr::declared_default_opset;
use tessera_common::onnx::proto::ModelProto;

/// Operators onnxruntime 1.32 has no opset-22 CPU kernel for.
const NO_KERNEL_AT_22: &[&str] = &["RoiAlign"];

/// `model` at opset 21 when it is at 22 and uses an operator in
/// [`NO_KERNEL_AT_22`] (a node of the main graph, default domain);
/// `None` when it runs as it is.
pub(super) fn lowered(model: &ModelProto) -> Option<ModelProto> {
    if declared_default_opset(model) != Some(22) {
        return None;
    }
    let graph = model.graph.as_ref()?;
    let needs = graph.node.iter().any(|n| {
        matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx"))
            && NO_KERNEL_AT_22.contains(&n.op_type.as_deref().unwrap_or(""))
    });
    if !needs {
        return None;
    }
    let mut lowered = model.clone();
    for opset in &mut lowered.opset_import {
        if matches!(opset.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            opset.version = Some(21);
        }
    }
    Some(lowered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::onnx::proto::{GraphProto, NodeProto, OperatorSetIdProto};

    fn model(op: &str, opset: i64) -> ModelProto {
        ModelProto {
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(opset),
            }],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    op_type: Some(op.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_models_at_22_with_a_missing_kernel_are_lowered() {
        let lowered = lowered(&model("RoiAlign", 22)).expect("lowered");
        assert_eq!(declared_default_opset(&lowered), Some(21));
        assert!(super::lowered(&model("RoiAlign", 21)).is_none());
        assert!(super::lowered(&model("Conv", 22)).is_none());
    }
}

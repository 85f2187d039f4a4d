//! Simple element-type and static-shape propagation for the tensors the model
//! leaves untyped. Declared types (value_info, inputs, outputs, initializers)
//! are never overwritten; what cannot be derived stays unknown.
//!
//! Layout: [`types`] holds the element-type rules (one table by op type),
//! [`shapes`] the static-shape rules (one file per op family, each with
//! its table by op type).

pub(crate) mod shapes;
pub(crate) mod types;

use std::collections::HashMap;

use super::{Graph, TensorId};
use crate::onnx::proto::{ModelProto, TensorProto};

pub(super) use crate::onnx::attr::{attr, attr_i};
use shapes::output_shapes;
use types::output_types;

pub(super) fn propagate(graph: &mut Graph, model: &ModelProto) {
    let Some(g) = model.graph.as_ref() else {
        return;
    };
    // Known constant values: initializers and outputs of Constant ops.
    let mut consts: HashMap<&str, &TensorProto> = g
        .initializer
        .iter()
        .filter_map(|t| Some((t.name.as_deref()?, t)))
        .collect();
    for n in &g.node {
        if n.op_type.as_deref() == Some("Constant") {
            if let (Some(out), Some(t)) = (
                n.output.first(),
                attr(n, "value").and_then(|a| a.t.as_ref()),
            ) {
                consts.insert(out.as_str(), t);
            }
        }
    }
    // Constant nodes have no inputs: they go first.
    let order: Vec<super::NodeId> = graph
        .dag
        .node_indices()
        .filter(|&n| {
            graph.dag[n].kind == super::NodeKind::Constant && graph.dag[n].onnx_index.is_some()
        })
        .chain(graph.topo_ops.iter().copied())
        .collect();
    for id in order {
        let node = &graph.dag[id];
        let Some(proto) = node.onnx_index.and_then(|k| g.node.get(k)) else {
            continue;
        };
        let ins: Vec<Option<TensorId>> = node.inputs.clone();
        let outs: Vec<Option<TensorId>> = node.outputs.clone();
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let in_type = |k: usize| {
            ins.get(k)
                .copied()
                .flatten()
                .and_then(|t| graph.tensors[t.index()].elem_type)
        };
        let in_shape = |k: usize| {
            ins.get(k)
                .copied()
                .flatten()
                .and_then(|t| graph.tensors[t.index()].shape.clone())
        };
        let const_ints = |k: usize| {
            let t = ins.get(k).copied().flatten()?;
            int_values(consts.get(graph.tensors[t.index()].name.as_str())?)
        };
        let types = if default_domain || node.domain == "com.microsoft" {
            output_types(proto, &in_type)
        } else if node.domain == crate::ops::GGML_DOMAIN {
            // Tessera's kernels over llama.cpp's blocks make float32.
            vec![Some(crate::onnx::ElemType::FLOAT); outs.len()]
        } else {
            vec![]
        };
        let shapes = if default_domain {
            output_shapes(proto, &in_shape, &const_ints)
        } else if node.domain == crate::ops::GGML_DOMAIN {
            vec![ggml_shape(proto, &in_shape)]
        } else {
            vec![]
        };
        for (k, out) in outs.iter().enumerate() {
            let Some(out) = out else { continue };
            let t = &mut graph.tensors[out.index()];
            if t.elem_type.is_none() {
                t.elem_type = types.get(k).copied().flatten();
            }
            if t.shape.is_none() {
                t.shape = shapes.get(k).cloned().flatten();
            }
        }
    }
}

/// The output shape of Tessera's kernels over llama.cpp's blocks:
/// `MatMul(x [.., K], blocks) -> [.., N]`, `Gather(blocks, indices [..])
/// -> [.., K]`.
fn ggml_shape(
    node: &crate::onnx::proto::NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<super::Dim>>,
) -> Option<Vec<super::Dim>> {
    let attr = |name| crate::onnx::attr::attr_i(node, name).map(super::Dim::Known);
    match node.op_type.as_deref()? {
        "MatMul" => {
            let mut x = in_shape(0)?;
            *x.last_mut()? = attr("N")?;
            Some(x)
        }
        "Gather" => {
            let mut indices = in_shape(1)?;
            indices.push(attr("K")?);
            Some(indices)
        }
        // Each token's chosen experts: the ids' shape, then N.
        "MatMulExperts" => {
            let mut ids = in_shape(1)?;
            ids.push(attr("N")?);
            Some(ids)
        }
        _ => None,
    }
}

/// Integer contents of a small int64/int32 initializer.
pub(super) fn int_values(t: &TensorProto) -> Option<Vec<i64>> {
    crate::tensor::Tensor::from_proto(t).ok()?.int_values()
}

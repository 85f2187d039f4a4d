//! QueryNetwork for the CPU plugin: a node is supported when tract can
//! build, type and optimize it alone, with its real input types and shapes
//! and its constant inputs as constants. Results are cached by op signature
//! (op, attributes, input types and shapes, constant values), so repeated
//! layers are probed once. Ops tract is known to compute wrongly are refused
//! whatever the probe says.

use prost::Message;
use tessera_common::decompose::decompose;
use tessera_common::graph::{Graph, NodeId};
use tessera_common::onnx::attr::attr;
use tessera_common::onnx::proto::{
    tensor_shape_proto::dimension, type_proto, ModelProto, NodeProto,
};
use tessera_common::onnx::ElemType;
use tract_onnx::prelude::*;

use tessera_common::declined::{refused, Declined};

use crate::plugin::{PluginError, QueryResult};
use crate::plugins::probe::ProbeCache;

/// Ops and variants tract is known to compute wrongly (measured against
/// onnxruntime and the ONNX node tests): refused, never run wrong.
fn known_wrong(node: &NodeProto, graph: &Graph, id: NodeId) -> Option<String> {
    let op = node.op_type.as_deref().unwrap_or("");
    let domain = node.domain.as_deref().unwrap_or("");
    if !domain.is_empty() && domain != "ai.onnx" {
        return Some(format!("domain '{domain}' is not supported"));
    }
    let direction = attr(node, "direction")
        .and_then(|a| a.s.as_deref())
        .unwrap_or(b"forward");
    let input_type = |k: usize| {
        graph
            .node(id)
            .inputs
            .get(k)
            .copied()
            .flatten()
            .and_then(|t| graph.tensor(t).elem_type)
    };
    match op {
        "LSTM" | "GRU" | "RNN" if direction != b"forward" => {
            Some(format!("{op} direction other than forward"))
        }
        "Attention" => Some("Attention is not computed correctly by tract".into()),
        "Celu" if input_type(0) == Some(ElemType::FLOAT16) => {
            Some("Celu on float16 is wrong in tract".into())
        }
        "AveragePool"
            if attr(node, "dilations").is_some_and(|a| a.ints.iter().any(|&d| d != 1)) =>
        {
            Some("AveragePool with dilations is wrong in tract".into())
        }
        // (Decomposed into integer MatMul and float rescaling when the
        // types are known; refused if that rule declined.)
        "QLinearMatMul" if input_type(0) == Some(ElemType::INT8) => {
            Some("QLinearMatMul on int8 is wrong in tract".into())
        }
        "BitShift" => Some("BitShift by the bit width or more is wrong in tract".into()),
        _ if op.starts_with("Reduce") && input_type(0) == Some(ElemType::BOOL) => {
            Some(format!("{op} on booleans"))
        }
        "Dropout" if node.input.get(2).is_some_and(|t| !t.is_empty()) => {
            Some("Dropout in training mode is not supported".into())
        }
        "If" => {
            let out = |name: &str| -> Option<Vec<Option<Vec<i64>>>> {
                let g = attr(node, name)?.g.as_ref()?;
                Some(
                    g.output
                        .iter()
                        .map(|v| match v.r#type.as_ref()?.value.as_ref()? {
                            type_proto::Value::TensorType(t) => Some(
                                t.shape
                                    .as_ref()?
                                    .dim
                                    .iter()
                                    .map(|d| match d.value {
                                        Some(dimension::Value::DimValue(v)) => v,
                                        _ => -1,
                                    })
                                    .collect(),
                            ),
                            _ => None,
                        })
                        .collect(),
                )
            };
            (out("then_branch") != out("else_branch"))
                .then(|| "If branches with different output shapes".into())
        }
        _ => None,
    }
}

/// How dynamic graph-input dims are filled when the whole model is probed.
#[derive(Debug, Clone, Copy)]
enum DynamicDims {
    /// Symbols, as compile sees them.
    Symbolic,
    /// The first dim 1, the others 64 (an image or a sequence that a
    /// detector's strides divide).
    Typical,
    /// Every dim 1.
    Unit,
}

/// Whether tract builds and optimizes the whole model with some filling of
/// its dynamic input dims: then it runs every node in the model's context
/// (a Reshape fed by a Shape chain, an LSTM) even where a node alone does
/// not type.
fn whole_model_builds(model: &ModelProto) -> Result<(), String> {
    let bytes = model.encode_to_vec();
    let graph = model.graph.as_ref().ok_or("no graph")?;
    let inits: std::collections::HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let inputs: Vec<Option<crate::plugin::TensorSpec>> = graph
        .input
        .iter()
        .filter(|v| !inits.contains(v.name.as_deref().unwrap_or("")))
        .map(crate::plugin::TensorSpec::from_value_info)
        .collect();
    let mut last = String::new();
    for fill in [
        DynamicDims::Symbolic,
        DynamicDims::Typical,
        DynamicDims::Unit,
    ] {
        let attempt = std::panic::catch_unwind(|| -> TractResult<()> {
            let mut m = tract_onnx::onnx()
                .with_ignore_value_info(true)
                .model_for_read(&mut &bytes[..])?;
            for (i, spec) in inputs.iter().enumerate() {
                let Some(spec) = spec else { continue };
                let (Some(dt), Some(shape)) = (super::tract::datum_type(spec.elem), &spec.shape)
                else {
                    continue;
                };
                let dims: TVec<TDim> = shape
                    .iter()
                    .enumerate()
                    .map(|(k, d)| match (d, fill) {
                        (Some(v), _) => TDim::Val(*v as i64),
                        (None, DynamicDims::Symbolic) => {
                            m.symbols.sym(&format!("in{i}_{k}")).into()
                        }
                        (None, DynamicDims::Typical) => TDim::Val(if k == 0 { 1 } else { 64 }),
                        (None, DynamicDims::Unit) => TDim::Val(1),
                    })
                    .collect();
                m.set_input_fact(i, InferenceFact::dt_shape(dt, dims))?;
            }
            m.into_optimized()?;
            Ok(())
        });
        match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = format!("{e}"),
            Err(_) => last = "tract panicked while building it".into(),
        }
    }
    Err(last)
}

/// Element types and shapes tract's analysis of the whole model gives the
/// tensors `graph` leaves untyped or unranked (static inference had no
/// rule, or the model's types are incomplete).
fn analysed_types(
    model: &ModelProto,
    graph: &Graph,
) -> std::collections::BTreeMap<String, crate::plugin::TensorSpec> {
    use tract_hir::infer::Factoid;
    let wanted: std::collections::HashSet<&str> = crate::plugins::untyped_intermediates(graph)
        .into_iter()
        .collect();
    if wanted.is_empty() {
        return Default::default();
    }
    let bytes = model.encode_to_vec();
    let analysed = std::panic::catch_unwind(|| -> TractResult<_> {
        let mut m = tract_onnx::onnx()
            .with_ignore_value_info(true)
            .model_for_read(&mut &bytes[..])?;
        // Obstinate: facts of what can be analysed, past what cannot.
        let _ = m.analyse(true);
        let mut types = std::collections::BTreeMap::new();
        for node in m.nodes() {
            for slot in 0..node.outputs.len() {
                let outlet = OutletId::new(node.id, slot);
                let Some(label) = m.outlet_label(outlet).filter(|l| wanted.contains(l)) else {
                    continue;
                };
                let fact = m.outlet_fact(outlet)?;
                let Some(elem) = fact
                    .datum_type
                    .concretize()
                    .and_then(super::tract::elem_type)
                else {
                    continue;
                };
                let shape = (!fact.shape.is_open()).then(|| {
                    fact.shape
                        .dims()
                        .map(|d| {
                            d.concretize()
                                .and_then(|d| d.to_i64().ok())
                                .and_then(|v| usize::try_from(v).ok())
                        })
                        .collect()
                });
                types.insert(
                    label.to_string(),
                    crate::plugin::TensorSpec {
                        name: label.to_string(),
                        elem,
                        shape,
                        kind: crate::plugin::ValueKind::Tensor,
                    },
                );
            }
        }
        Ok(types)
    });
    match analysed {
        Ok(Ok(types)) => types,
        Ok(Err(e)) => {
            tracing::debug!("tract's analysis of the model failed: {e}");
            Default::default()
        }
        Err(_) => Default::default(),
    }
}

fn probe(model: &ModelProto) -> Result<(), Declined> {
    let bytes = model.encode_to_vec();
    let result = std::panic::catch_unwind(|| -> TractResult<()> {
        tract_onnx::onnx()
            .with_ignore_value_info(true)
            .model_for_read(&mut &bytes[..])?
            .into_optimized()?;
        Ok(())
    });
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(refused(e)),
        Err(_) => Err(refused("tract panicked while building it")),
    }
}

pub(super) fn query_network(
    model: &ModelProto,
    cache: &ProbeCache,
) -> Result<QueryResult, PluginError> {
    let graph =
        Graph::from_model(model.clone()).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
    // Ops tract lacks are rewritten first (as at compile); an original node
    // is supported when every node of its expansion is.
    let decomposed = decompose(&graph, tract_lacks);
    let inner = if decomposed.origin.is_empty() {
        query_graph(&graph, cache, |_| false)?
    } else {
        let expanded = Graph::from_model(decomposed.model.clone())
            .map_err(|e| PluginError::InvalidModel(format!("after decomposition: {e}")))?;
        query_graph(&expanded, cache, |n| decomposed.origin.contains_key(n))?
    };
    let mut result = QueryResult {
        types: analysed_types(graph.model(), &graph),
        ..Default::default()
    };
    for (node, why) in inner.unsupported {
        let original = decomposed.original(&node).to_string();
        // A node a rule declined was probed as it is; say why it was kept.
        let why = match decomposed.declined.get(&original) {
            Some(declined) => format!("{why} ({declined})"),
            None if original != node => format!("{node} of its expansion: {why}"),
            None => why,
        };
        result.unsupported.entry(original).or_insert(why);
    }
    for node in inner.supported {
        let original = decomposed.original(&node);
        if !result.unsupported.contains_key(original) {
            result.supported.insert(original.to_string());
        }
    }
    Ok(result)
}

/// Whether tract wants `op`'s decomposition rule: every rule but Pow's
/// (tract takes unsigned exponents as they are; the rule's int64 exponent
/// under a float base makes tract 0.23 panic at run time) and Resize's
/// (tract resizes with align_corners as the specification does, without
/// the rule's interpolation matrices).
fn tract_lacks(op: &str) -> bool {
    !matches!(op, "Pow" | "Resize")
}

/// The model `compile` hands to tract: ops tract lacks decomposed.
pub(super) fn for_tract(model: &ModelProto) -> Result<Option<ModelProto>, PluginError> {
    let graph =
        Graph::from_model(model.clone()).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
    let decomposed = decompose(&graph, tract_lacks);
    Ok((!decomposed.origin.is_empty()).then_some(decomposed.model))
}

/// `written_by_us(name)`: the node is part of an expansion, written to
/// avoid what `known_wrong` refuses (e.g. a BitShift with clamped amounts).
fn query_graph(
    graph: &Graph,
    cache: &ProbeCache,
    written_by_us: impl Fn(&str) -> bool,
) -> Result<QueryResult, PluginError> {
    // The graph names unnamed nodes; probe against its (normalized) model.
    let named = graph.model();
    let source = named
        .graph
        .as_ref()
        .ok_or_else(|| PluginError::InvalidModel("no graph".into()))?;
    let mut result = QueryResult::default();
    // If tract builds the whole model, it builds every node of it.
    let whole = match whole_model_builds(named) {
        Ok(()) => true,
        Err(why) => {
            tracing::debug!("the whole model does not build ({why}); probing node by node");
            false
        }
    };
    for &id in graph.topo_ops() {
        let name = graph.node(id).name.clone();
        let Some(node) = graph.node(id).onnx_index.and_then(|i| source.node.get(i)) else {
            continue;
        };
        if let Some(why) = untyped_for_tract(graph, id) {
            result.unsupported.insert(name, why);
            continue;
        }
        if let Some(why) = known_wrong(node, graph, id).filter(|_| !written_by_us(&name)) {
            result.unsupported.insert(name, why);
            continue;
        }
        let outcome = if whole {
            Ok(())
        } else {
            probe_node(named, graph, id, cache)
        };
        result.record(name, outcome);
    }
    Ok(result)
}

/// A tensor of `id` whose element type tract's tensors here do not carry
/// (strings, float8, the packed 4-bit types).
fn untyped_for_tract(graph: &Graph, id: NodeId) -> Option<String> {
    let node = graph.node(id);
    node.inputs
        .iter()
        .chain(&node.outputs)
        .flatten()
        .filter_map(|&t| graph.tensor(t).elem_type)
        .find(|&elem| super::tract::datum_type(elem).is_none())
        .map(|elem| format!("tensors of type {elem} are not carried to tract"))
}

/// Probes one node alone (cached by op signature).
fn probe_node(
    model: &ModelProto,
    graph: &Graph,
    id: NodeId,
    cache: &ProbeCache,
) -> Result<(), Declined> {
    cache.probe(model, graph, id, probe)
}

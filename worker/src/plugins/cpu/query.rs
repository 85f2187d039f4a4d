//! QueryNetwork for the CPU plugin: a node is supported when tract can
//! build, type and optimize it alone, with its real input types and shapes
//! and its constant inputs as constants. Results are cached by op signature
//! (op, attributes, input types and shapes, constant values), so repeated
//! layers are probed once. Ops tract is known to compute wrongly are refused
//! whatever the probe says.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use prost::Message;
use tessera_common::decompose::decompose;
use tessera_common::graph::{Dim, Graph, NodeKind};
use tessera_common::onnx::proto::{
    tensor_shape_proto::dimension, type_proto, AttributeProto, GraphProto, ModelProto, NodeProto,
    TypeProto, ValueInfoProto,
};
use tessera_common::onnx::ElemType;
use tract_onnx::prelude::*;

use crate::plugin::{PluginError, QueryResult};

/// Probe outcomes by op signature.
#[derive(Default)]
pub(super) struct ProbeCache(Mutex<HashMap<u64, Result<(), String>>>);

/// Element type and shape (`None`: dynamic) of a tensor ValueInfo.
pub(super) fn declared_type(v: &ValueInfoProto) -> Option<(ElemType, Vec<Option<usize>>)> {
    let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    let elem = ElemType(t.elem_type.filter(|&e| e != 0)?);
    let shape = t
        .shape
        .as_ref()?
        .dim
        .iter()
        .map(|d| match d.value {
            Some(dimension::Value::DimValue(v)) => usize::try_from(v).ok(),
            _ => None,
        })
        .collect();
    Some((elem, shape))
}

fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
}

/// Ops and variants tract is known to compute wrongly (measured against
/// onnxruntime and the ONNX node tests): refused, never run wrong.
fn known_wrong(
    node: &NodeProto,
    graph: &Graph,
    id: tessera_common::graph::NodeId,
) -> Option<String> {
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
        "Celu" if input_type(0) == Some(ElemType(10)) => {
            Some("Celu on float16 is wrong in tract".into())
        }
        "AveragePool"
            if attr(node, "dilations").is_some_and(|a| a.ints.iter().any(|&d| d != 1)) =>
        {
            Some("AveragePool with dilations is wrong in tract".into())
        }
        // (Decomposed into integer MatMul and float rescaling when the
        // types are known; refused if that rule declined.)
        "QLinearMatMul" if input_type(0) == Some(ElemType(3)) => {
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

/// A typed input for a probe. Dynamic dims become 1: QueryNetwork asks
/// whether tract can run the op, and tract types some ops (a Reshape fed
/// by a Shape) only with concrete dims, which it will have at run time.
fn value_info(name: &str, elem: ElemType, shape: &[Dim]) -> ValueInfoProto {
    let dims: Vec<i64> = shape.iter().map(|d| d.known().unwrap_or(1)).collect();
    tessera_common::onnx::tensor_info(name, elem.0, &dims)
}

/// `model` with every dynamic graph-input dim set to 1 (see [`value_info`]).
fn with_unit_dims(model: &ModelProto) -> ModelProto {
    let mut m = model.clone();
    if let Some(g) = m.graph.as_mut() {
        for v in g.input.iter_mut() {
            if let Some(TypeProto {
                value: Some(type_proto::Value::TensorType(t)),
                ..
            }) = v.r#type.as_mut()
            {
                for d in t.shape.iter_mut().flat_map(|s| s.dim.iter_mut()) {
                    if !matches!(d.value, Some(dimension::Value::DimValue(v)) if v >= 0) {
                        d.value = Some(dimension::Value::DimValue(1));
                    }
                }
            }
        }
    }
    m
}

/// The one-node model probing `node`, and its cache key.
fn probe_model(
    model: &ModelProto,
    graph: &Graph,
    id: tessera_common::graph::NodeId,
) -> Result<(ModelProto, u64), String> {
    let source = model.graph.as_ref().ok_or("no graph")?;
    let ir = graph.node(id);
    let node = ir
        .onnx_index
        .and_then(|i| source.node.get(i))
        .ok_or("node not in model")?;
    let mut g = GraphProto {
        name: Some("probe".into()),
        ..Default::default()
    };
    let mut key = DefaultHasher::new();
    let mut bare = node.clone();
    bare.name = None;
    bare.input.clear();
    bare.output.clear();
    bare.encode_to_vec().hash(&mut key);
    for t in ir.all_inputs() {
        let tensor = graph.tensor(t);
        let producer = graph.node(tensor.producer);
        let constant = producer.kind == NodeKind::Constant;
        if constant {
            if let Some(init) = source
                .initializer
                .iter()
                .find(|i| i.name.as_deref() == Some(tensor.name.as_str()))
            {
                init.encode_to_vec().hash(&mut key);
                g.initializer.push(init.clone());
                continue;
            }
            if let Some(c) = producer.onnx_index.and_then(|i| source.node.get(i)) {
                c.attribute
                    .iter()
                    .for_each(|a| a.encode_to_vec().hash(&mut key));
                g.node.push(c.clone());
                continue;
            }
        }
        let elem = tensor
            .elem_type
            .ok_or_else(|| format!("input '{}' has an unknown type", tensor.name))?;
        let shape = tensor
            .shape
            .as_ref()
            .ok_or_else(|| format!("input '{}' has an unknown rank", tensor.name))?;
        (elem.0, shape).hash(&mut key);
        g.input.push(value_info(&tensor.name, elem, shape));
    }
    g.node.push(node.clone());
    for out in node.output.iter().filter(|o| !o.is_empty()) {
        g.output.push(ValueInfoProto {
            name: Some(out.clone()),
            ..Default::default()
        });
    }
    let probe = ModelProto {
        ir_version: model.ir_version,
        opset_import: model.opset_import.clone(),
        graph: Some(g),
        functions: model.functions.clone(),
        ..Default::default()
    };
    model
        .opset_import
        .iter()
        .for_each(|o| (o.domain.clone(), o.version).hash(&mut key));
    Ok((probe, key.finish()))
}

fn probe(model: &ModelProto) -> Result<(), String> {
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
        Ok(Err(e)) => Err(format!("{e}")),
        Err(_) => Err("tract panicked while building it".into()),
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
    let decomposed = decompose(&graph, |_| true);
    let inner = if decomposed.origin.is_empty() {
        query_graph(&graph, cache, |_| false)?
    } else {
        let expanded = Graph::from_model(decomposed.model.clone())
            .map_err(|e| PluginError::InvalidModel(format!("after decomposition: {e}")))?;
        query_graph(&expanded, cache, |n| decomposed.origin.contains_key(n))?
    };
    let mut result = QueryResult::default();
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

/// The model `compile` hands to tract: ops tract lacks decomposed.
pub(super) fn for_tract(model: &ModelProto) -> Result<Option<ModelProto>, PluginError> {
    let graph =
        Graph::from_model(model.clone()).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
    let decomposed = decompose(&graph, |_| true);
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
    let whole = probe(&with_unit_dims(named)).is_ok();
    for &id in graph.topo_ops() {
        let name = graph.node(id).name.clone();
        let Some(node) = graph.node(id).onnx_index.and_then(|i| source.node.get(i)) else {
            continue;
        };
        if let Some(why) = known_wrong(node, graph, id).filter(|_| !written_by_us(&name)) {
            result.unsupported.insert(name, why);
            continue;
        }
        let outcome = if whole {
            Ok(())
        } else {
            probe_node(named, graph, id, cache)
        };
        match outcome {
            Ok(()) => {
                result.supported.insert(name);
            }
            Err(why) => {
                result.unsupported.insert(name, why);
            }
        }
    }
    Ok(result)
}

/// Probes one node alone (cached by op signature).
fn probe_node(
    model: &ModelProto,
    graph: &Graph,
    id: tessera_common::graph::NodeId,
    cache: &ProbeCache,
) -> Result<(), String> {
    let (probe_model, key) = probe_model(model, graph, id)?;
    if let Some(r) = cache.0.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return r;
    }
    let r = probe(&probe_model);
    if let Ok(mut c) = cache.0.lock() {
        c.insert(key, r.clone());
    }
    r
}

//! Node-by-node QueryNetwork probes, shared by the backends that answer
//! QueryNetwork by building what they are asked about: a node is cut out
//! into a one-node model (its constant inputs as constants, the others as
//! typed inputs) that the backend tries to build. Outcomes are cached by op
//! signature (op, attributes, input types and shapes, constant values), so
//! repeated layers are probed once.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use prost::Message;
use tessera_common::declined::{invalid, unknown, Declined};
use tessera_common::graph::{Dim, Graph, NodeId, NodeKind};
use tessera_common::onnx::proto::{GraphProto, ModelProto, ValueInfoProto};
use tessera_common::onnx::ElemType;

/// Probe outcomes by op signature.
#[derive(Default)]
pub struct ProbeCache(Mutex<HashMap<u64, Result<(), Declined>>>);

impl ProbeCache {
    /// Whether `build` accepts node `id` of `model` alone (cached).
    pub fn probe(
        &self,
        model: &ModelProto,
        graph: &Graph,
        id: NodeId,
        build: impl FnOnce(&ModelProto) -> Result<(), Declined>,
    ) -> Result<(), Declined> {
        let (probe_model, key) = probe_model(model, graph, id)?;
        if let Some(r) = self.0.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return r;
        }
        let r = build(&probe_model);
        if let Ok(mut c) = self.0.lock() {
            c.insert(key, r.clone());
        }
        r
    }
}

/// A typed input for a probe. Dynamic dims become 1: QueryNetwork asks
/// whether the backend can run the op, and some backends type some ops (a
/// Reshape fed by a Shape) only with concrete dims, which they will have at
/// run time.
fn value_info(name: &str, elem: ElemType, shape: &[Dim]) -> ValueInfoProto {
    let dims: Vec<i64> = shape.iter().map(|d| d.known().unwrap_or(1)).collect();
    tessera_common::onnx::tensor_info(name, elem.0, &dims)
}

/// The one-node model probing node `id`, and its cache key.
pub fn probe_model(
    model: &ModelProto,
    graph: &Graph,
    id: NodeId,
) -> Result<(ModelProto, u64), Declined> {
    let source = model.graph.as_ref().ok_or_else(|| invalid("no graph"))?;
    let ir = graph.node(id);
    let node = ir
        .onnx_index
        .and_then(|i| source.node.get(i))
        .ok_or_else(|| invalid("node not in model"))?;
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
        if producer.kind == NodeKind::Constant {
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
            .ok_or_else(|| unknown(format!("input '{}' has an unknown type", tensor.name)))?;
        let shape = tensor
            .shape
            .as_ref()
            .ok_or_else(|| unknown(format!("input '{}' has an unknown rank", tensor.name)))?;
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

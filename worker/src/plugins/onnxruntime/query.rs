//! QueryNetwork for the onnxruntime plugin.
//!
//! onnxruntime has no QueryNetwork of its own: it either builds a session
//! for a model or names what stopped it. So the whole model is built first
//! (graph optimizations off: only kernel lookup and type inference are
//! asked); if onnxruntime builds it, it runs every node of it, in the
//! model's context (shape chains, LSTMs, contrib ops). Otherwise each node
//! is built alone as a one-node model (cached by op signature), and the
//! nodes onnxruntime refuses are answered with its own message.
//!
//! Types of intermediates that static inference left untyped or unranked
//! come from onnxruntime's own type inference: the model is built once with
//! those tensors as extra outputs and the session's output metadata read.

use std::collections::{BTreeMap, HashSet};

use prost::Message;
use tessera_common::declined::{refused, unsupported, Declined};
use tessera_common::decompose::{decompose_where, Decomposed};
use tessera_common::graph::Graph;
use tessera_common::onnx::attr;
use tessera_common::onnx::proto::{ModelProto, NodeProto, ValueInfoProto};
use tessera_common::tensor::Tensor;

use super::library::Runtime;
use super::session::{build_session, SessionSettings};
use crate::plugin::{PluginError, QueryResult, TensorSpec};
use crate::plugins::probe::ProbeCache;

const PROBE: SessionSettings = SessionSettings {
    threads: 1,
    spin: false,
};

/// A node, and the constant (initializer) inputs of the model it is in.
struct Site<'a> {
    node: &'a NodeProto,
    model: &'a ModelProto,
}

impl Site<'_> {
    fn int(&self, name: &str) -> Option<i64> {
        attr::attr_i(self.node, name)
    }

    fn text(&self, name: &str) -> Option<&[u8]> {
        attr::attr(self.node, name).and_then(|a| a.s.as_deref())
    }

    fn has_input(&self, k: usize) -> bool {
        attr::input(self.node, k).is_some()
    }

    /// Input `k`'s values, if it is an initializer.
    fn constant(&self, k: usize) -> Option<Tensor> {
        let name = self.node.input.get(k)?;
        let init = self
            .model
            .graph
            .as_ref()?
            .initializer
            .iter()
            .find(|t| t.name.as_ref() == Some(name))?;
        Tensor::from_proto(init).ok()
    }
}

/// Variants onnxruntime 1.32 computes differently from the operator's
/// specification (found by the ONNX node tests; Python's onnxruntime gives
/// the same numbers): refused, never run wrong.
/// A rule: why onnxruntime gets this node wrong, if it does.
type Rule = fn(&Site) -> Option<&'static str>;

const KNOWN_WRONG: &[(&str, Rule)] = &[
    ("AveragePool", |s| {
        let dilated =
            attr::attr_ints(s.node, "dilations").is_some_and(|d| d.iter().any(|&d| d != 1));
        (dilated && s.int("ceil_mode") == Some(1) && s.int("count_include_pad") == Some(1))
            .then_some("AveragePool with dilations, ceil_mode and count_include_pad")
    }),
    ("MaxUnpool", |s| {
        s.has_input(2)
            .then_some("MaxUnpool with an output_shape input")
    }),
    ("Resize", |s| {
        let smooth = matches!(s.text("mode"), Some(b"linear" | b"cubic"));
        let corners = s.text("coordinate_transformation_mode") == Some(b"align_corners");
        let down = s
            .constant(2)
            .and_then(|t| t.float_values())
            .is_some_and(|v| v.iter().any(|&x| x < 1.0));
        (smooth && corners && down)
            .then_some("Resize downsampling with align_corners (linear, cubic)")
    }),
    ("Dropout", |s| {
        // training_mode: on unless it is a constant false; a constant ratio
        // of 0 drops nothing (the output is the input, the mask all true).
        let training = s.has_input(2)
            && s.constant(2)
                .is_none_or(|t| t.bytes().iter().any(|&b| b != 0));
        let keeps_all = s
            .constant(1)
            .and_then(|t| t.float_values())
            .is_some_and(|v| v.iter().all(|&r| r == 0.0));
        (training && !keeps_all).then_some("Dropout in training mode is random")
    }),
    ("Cast", |s| {
        // INT4 = 22, UINT4 = 21: onnxruntime wraps out-of-range values
        // (-9 becomes 7), the specification saturates (-9 becomes -8).
        matches!(s.int("to"), Some(21 | 22))
            .then_some("Cast to a 4-bit integer type wraps out-of-range values")
    }),
];

fn known_wrong(node: &NodeProto, model: &ModelProto) -> Option<String> {
    let op = node.op_type.as_deref()?;
    let domain = node.domain.as_deref().unwrap_or("");
    if !domain.is_empty() && domain != "ai.onnx" {
        return None;
    }
    let site = Site { node, model };
    KNOWN_WRONG
        .iter()
        .filter(|(o, _)| *o == op)
        .find_map(|(_, rule)| rule(&site))
        .map(|why| format!("{why}: onnxruntime computes it differently from the specification"))
}

fn builds(runtime: &Runtime, model: &ModelProto) -> Result<(), Declined> {
    build_session(runtime, &model.encode_to_vec(), &PROBE, false, None)
        .map(|_| ())
        .map_err(refused)
}

/// A node's name and whether onnxruntime runs it (or why not).
type Outcome = (String, Result<(), Declined>);

/// Each op node of `graph` (in order) with whether onnxruntime runs it:
/// refused where it computes the node differently from the specification,
/// and, when it does not build the whole model, where it does not build
/// the node alone. `written_by_us(name)`: the node is part of an
/// expansion, written to avoid what the known-wrong rules refuse (a Cast
/// to INT4 of values already clipped and rounded).
fn node_outcomes(
    runtime: &Runtime,
    graph: &Graph,
    cache: &ProbeCache,
    written_by_us: impl Fn(&str) -> bool,
) -> Result<Vec<Outcome>, PluginError> {
    // The graph names unnamed nodes; probe against its (normalized) model.
    let named = graph.model();
    let whole = builds(runtime, named);
    if let Err(why) = &whole {
        tracing::debug!("onnxruntime does not build the whole model ({why}); probing node by node");
    }
    let source = named
        .graph
        .as_ref()
        .ok_or_else(|| PluginError::InvalidModel("no graph".into()))?;
    let mut outcomes = Vec::new();
    for &id in graph.topo_ops() {
        let name = graph.node(id).name.clone();
        let wrong = graph
            .node(id)
            .onnx_index
            .and_then(|i| source.node.get(i))
            .filter(|_| !written_by_us(&name))
            .and_then(|n| known_wrong(n, named));
        let outcome = match (wrong, &whole) {
            (Some(why), _) => Err(unsupported(why)),
            (None, Ok(())) => Ok(()),
            (None, Err(_)) => cache.probe(named, graph, id, |m| builds(runtime, m)),
        };
        outcomes.push((name, outcome));
    }
    Ok(outcomes)
}

/// The nodes onnxruntime refuses rewritten, where a rule exists, as
/// standard ops (an ONNX function body, a wider type, transposes around
/// a batch-first layer); `None` when nothing was rewritten.
fn decomposed(graph: &Graph, outcomes: &[Outcome]) -> Option<Decomposed> {
    let refused: HashSet<&str> = outcomes
        .iter()
        .filter(|(_, o)| o.is_err())
        .map(|(n, _)| n.as_str())
        .collect();
    if refused.is_empty() {
        return None;
    }
    let d = decompose_where(graph, |n| refused.contains(n.name.as_deref().unwrap_or("")));
    (!d.origin.is_empty()).then_some(d)
}

pub(super) fn query_network(
    runtime: &Runtime,
    model: &ModelProto,
    cache: &ProbeCache,
) -> Result<QueryResult, PluginError> {
    let graph =
        Graph::from_model(model.clone()).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
    let outcomes = node_outcomes(runtime, &graph, cache, |_| false)?;
    let mut result = QueryResult {
        types: analysed_types(runtime, graph.model(), &graph),
        ..Default::default()
    };
    let Some(d) = decomposed(&graph, &outcomes) else {
        for (name, outcome) in outcomes {
            result.record(name, outcome);
        }
        return Ok(result);
    };
    // An original node runs when every node of its expansion does.
    let expanded = Graph::from_model(d.model.clone())
        .map_err(|e| PluginError::InvalidModel(format!("after decomposition: {e}")))?;
    let mut merged: BTreeMap<String, Result<(), Declined>> = BTreeMap::new();
    for (node, outcome) in node_outcomes(runtime, &expanded, cache, |n| d.origin.contains_key(n))? {
        let original = d.original(&node).to_string();
        let outcome = outcome.map_err(|why| {
            why.map(|why| match d.declined.get(&original) {
                Some(declined) => format!("{why} ({declined})"),
                None if original != node => format!("{node} of its expansion: {why}"),
                None => why,
            })
        });
        let entry = merged.entry(original).or_insert(Ok(()));
        if entry.is_ok() {
            *entry = outcome;
        }
    }
    for (name, outcome) in merged {
        result.record(name, outcome);
    }
    Ok(result)
}

/// What `compile` hands onnxruntime for `model`: the model with the nodes
/// onnxruntime refuses decomposed, as QueryNetwork answered; `None` when
/// it runs the model as it is.
pub(super) fn for_onnxruntime(
    runtime: &Runtime,
    model: &ModelProto,
    cache: &ProbeCache,
) -> Result<Option<ModelProto>, PluginError> {
    let graph =
        Graph::from_model(model.clone()).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
    let outcomes = node_outcomes(runtime, &graph, cache, |_| false)?;
    Ok(decomposed(&graph, &outcomes).map(|d| d.model))
}

/// Whether a node of `model` is one onnxruntime computes differently from
/// the specification (so `compile` must decompose it first).
pub(super) fn has_known_wrong(model: &ModelProto) -> bool {
    model
        .graph
        .as_ref()
        .is_some_and(|g| g.node.iter().any(|n| known_wrong(n, model).is_some()))
}

/// Types onnxruntime infers for the intermediates `graph` leaves untyped
/// or unranked.
fn analysed_types(
    runtime: &Runtime,
    model: &ModelProto,
    graph: &Graph,
) -> BTreeMap<String, TensorSpec> {
    let wanted = crate::plugins::untyped_intermediates(graph);
    if wanted.is_empty() {
        return BTreeMap::new();
    }
    let mut probe = model.clone();
    let Some(g) = probe.graph.as_mut() else {
        return BTreeMap::new();
    };
    for name in &wanted {
        if !g.output.iter().any(|o| o.name.as_deref() == Some(name)) {
            g.output.push(ValueInfoProto {
                name: Some(name.to_string()),
                ..Default::default()
            });
        }
    }
    let session = match build_session(runtime, &probe.encode_to_vec(), &PROBE, false, None) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("onnxruntime's type inference of the model failed: {e}");
            return BTreeMap::new();
        }
    };
    session
        .outputs()
        .iter()
        .filter(|o| wanted.contains(&o.name()))
        .filter_map(|o| {
            let mut spec = super::convert::spec(o.name(), o.dtype())?;
            // onnxruntime reports an unknown rank as no dims: a scalar is
            // declared without a shape rather than risk a wrong rank.
            if spec.shape.as_ref().is_some_and(Vec::is_empty) {
                spec.shape = None;
            }
            Some((o.name().to_string(), spec))
        })
        .collect()
}

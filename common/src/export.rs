//! Export: each subgraph becomes a standalone, valid ONNX model with its
//! nodes, only the initializers it reads, typed inputs and outputs for its
//! boundary tensors and the original opset imports. Running the exported
//! models one after another in id order reproduces the whole model.

use std::collections::HashMap;

use crate::graph::{Dim, Graph, TensorId, OPTIONAL_OP, SEQUENCE_OPS};
use crate::onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, GraphProto, ModelProto, SparseTensorProto, StringStringEntryProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::partition::{Partition, Subgraph};

/// Why a subgraph could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("tensor '{tensor}' crosses into or out of subgraph {sg} but its element type is unknown (add value_info to the model)")]
    UnknownType { tensor: String, sg: usize },
    #[error("the model has no graph")]
    NoGraph,
}

/// Exports every subgraph of `p`, in id order.
pub fn export_all(graph: &Graph, p: &Partition) -> Result<Vec<ModelProto>, ExportError> {
    let ctx = Context::new(graph)?;
    p.subgraphs
        .iter()
        .map(|sg| ctx.export(graph, p, sg))
        .collect()
}

/// Checks that every tensor crossing a subgraph boundary of `p` can be
/// declared (what [`export_subgraph`] would fail on), without exporting.
pub fn check_boundaries(graph: &Graph, p: &Partition) -> Result<(), ExportError> {
    let ctx = Context::new(graph)?;
    for sg in &p.subgraphs {
        for &t in sg.inputs.iter().chain(&sg.outputs) {
            ctx.value_info(graph, t, sg.id)?;
        }
    }
    Ok(())
}

/// Exports one subgraph.
pub fn export_subgraph(
    graph: &Graph,
    p: &Partition,
    sg: &Subgraph,
) -> Result<ModelProto, ExportError> {
    Context::new(graph)?.export(graph, p, sg)
}

struct Context<'g> {
    source: &'g GraphProto,
    initializers: HashMap<&'g str, &'g TensorProto>,
    sparse: HashMap<&'g str, &'g SparseTensorProto>,
    value_info: HashMap<&'g str, &'g ValueInfoProto>,
}

impl<'g> Context<'g> {
    fn new(graph: &'g Graph) -> Result<Context<'g>, ExportError> {
        let source = graph.model().graph.as_ref().ok_or(ExportError::NoGraph)?;
        let initializers = source
            .initializer
            .iter()
            .filter_map(|t| Some((t.name.as_deref()?, t)))
            .collect();
        let sparse = source
            .sparse_initializer
            .iter()
            .filter_map(|s| Some((s.values.as_ref()?.name.as_deref()?, s)))
            .collect();
        let value_info = source
            .value_info
            .iter()
            .chain(&source.input)
            .chain(&source.output)
            .filter_map(|v| Some((v.name.as_deref()?, v)))
            .collect();
        Ok(Context {
            source,
            initializers,
            sparse,
            value_info,
        })
    }

    fn value_info(
        &self,
        graph: &Graph,
        t: TensorId,
        sg: usize,
    ) -> Result<ValueInfoProto, ExportError> {
        let tensor = graph.tensor(t);
        // Tensor types come from the IR (declared types, completed by
        // propagation); other types (sequences, maps, …) as declared.
        if let Some(v) = self.value_info.get(tensor.name.as_str()) {
            let declared = v.r#type.as_ref().and_then(|t| t.value.as_ref());
            if declared.is_some_and(|d| !matches!(d, type_proto::Value::TensorType(_))) {
                return Ok((*v).clone());
            }
        }
        let elem = tensor.elem_type.ok_or_else(|| ExportError::UnknownType {
            tensor: tensor.name.clone(),
            sg,
        })?;
        let shape = tensor.shape.as_ref().map(|dims| TensorShapeProto {
            dim: dims
                .iter()
                .map(|d| Dimension {
                    denotation: None,
                    value: match d {
                        Dim::Known(v) => Some(dimension::Value::DimValue(*v)),
                        Dim::Sym(s) => Some(dimension::Value::DimParam(s.clone())),
                        Dim::Unknown => None,
                    },
                })
                .collect(),
        });
        let tensor_value = type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem.0),
            shape,
        });
        let element = |value| {
            Some(Box::new(TypeProto {
                denotation: None,
                value: Some(value),
            }))
        };
        // The IR types a sequence or an optional by its elements: declare
        // what the producing op makes.
        let producer = graph.node(tensor.producer).op_type.as_str();
        let value = if SEQUENCE_OPS.contains(&producer) {
            type_proto::Value::SequenceType(Box::new(type_proto::Sequence {
                elem_type: element(tensor_value),
            }))
        } else if producer == OPTIONAL_OP {
            type_proto::Value::OptionalType(Box::new(type_proto::Optional {
                elem_type: element(tensor_value),
            }))
        } else {
            tensor_value
        };
        Ok(ValueInfoProto {
            name: Some(tensor.name.clone()),
            r#type: Some(TypeProto {
                denotation: None,
                value: Some(value),
            }),
            ..Default::default()
        })
    }

    fn export(
        &self,
        graph: &Graph,
        p: &Partition,
        sg: &Subgraph,
    ) -> Result<ModelProto, ExportError> {
        let model = graph.model();
        let device = p.device_of(sg).to_string();
        let mut g = GraphProto {
            name: Some(format!(
                "{}_subgraph{}_{}",
                graph.model_name(),
                sg.id,
                device.replace('/', "_")
            )),
            ..Default::default()
        };
        // Constant nodes first (they have no inputs), then the ops in order.
        g.node = sg
            .constants
            .iter()
            .chain(&sg.nodes)
            .filter_map(|&n| {
                graph
                    .node(n)
                    .onnx_index
                    .and_then(|i| self.source.node.get(i))
                    .cloned()
            })
            .collect();
        for &c in &sg.constants {
            let name = graph.node(c).name.as_str();
            if graph.node(c).onnx_index.is_some() {
                continue;
            }
            if let Some(t) = self.initializers.get(name) {
                g.initializer.push((*t).clone());
            } else if let Some(s) = self.sparse.get(name) {
                g.sparse_initializer.push((*s).clone());
            }
        }
        for &t in &sg.inputs {
            g.input.push(self.value_info(graph, t, sg.id)?);
        }
        // Before IR version 4 every initializer is also a graph input.
        if model.ir_version.is_some_and(|v| v < 4) {
            for init in &g.initializer {
                let dims: Vec<i64> = init.dims.clone();
                let name = init.name.as_deref().unwrap_or("");
                g.input.push(crate::onnx::tensor_info(
                    name,
                    init.data_type.unwrap_or(0),
                    &dims,
                ));
            }
        }
        for &t in &sg.outputs {
            g.output.push(self.value_info(graph, t, sg.id)?);
        }
        let boundary: std::collections::HashSet<&str> = sg
            .inputs
            .iter()
            .chain(&sg.outputs)
            .map(|&t| graph.tensor(t).name.as_str())
            .collect();
        for n in &g.node {
            for out in &n.output {
                if let Some(v) = self.value_info.get(out.as_str()) {
                    if !boundary.contains(out.as_str()) {
                        g.value_info.push((*v).clone());
                    }
                }
            }
        }
        let mut metadata = model.metadata_props.clone();
        metadata.push(StringStringEntryProto {
            key: Some("tessera.subgraph".into()),
            value: Some(sg.id.to_string()),
        });
        metadata.push(StringStringEntryProto {
            key: Some("tessera.device".into()),
            value: Some(device),
        });
        Ok(ModelProto {
            ir_version: model.ir_version,
            opset_import: model.opset_import.clone(),
            producer_name: Some("tessera".into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            domain: model.domain.clone(),
            model_version: model.model_version,
            doc_string: None,
            graph: Some(g),
            metadata_props: metadata,
            training_info: Vec::new(),
            functions: model.functions.clone(),
            configuration: Vec::new(),
        })
    }
}

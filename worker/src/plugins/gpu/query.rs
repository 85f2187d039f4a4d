//! QueryNetwork's verdict on one node: its op and attributes (`ops`),
//! ranks, storage bindings within the adapter's limit, float element types
//! (f32, or f16 with shader-f16; one per node except Cast) and constant
//! shape-like inputs.

use tessera_common::declined::{unknown, unsupported, Declined};
use tessera_common::graph::{Graph, Node, NodeKind, Tensor};
use tessera_common::onnx::proto::NodeProto;
use tessera_common::onnx::ElemType;

use super::ops;

/// What nodes are checked against: the graph and its ONNX nodes, and the
/// adapter's limits.
pub(super) struct Query<'g> {
    pub graph: &'g Graph,
    pub nodes: &'g [NodeProto],
    pub opset: i64,
    /// Whether the adapter has shader-f16.
    pub half: bool,
    /// The largest storage binding, bytes.
    pub max_binding: u64,
}

impl Query<'_> {
    /// Why `node` cannot run on the adapter, or `Ok`.
    pub fn verdict(&self, node: &Node) -> Result<(), Declined> {
        let proto = node
            .onnx_index
            .and_then(|i| self.nodes.get(i))
            .ok_or_else(|| unsupported("not an ONNX node"))?;
        if node.has_subgraphs {
            return Err(unsupported("control flow"));
        }
        ops::check(proto, self.opset)?;
        let first = node.inputs.first().copied().flatten();
        let shape = first.and_then(|t| self.graph.tensor(t).shape.as_ref());
        ops::check_rank(proto, shape.map(|s| s.len()))?;
        let empty = shape.is_some_and(|s| s.iter().any(|d| d.known() == Some(0)));
        if empty && proto.op_type().starts_with("Reduce") {
            return Err(unsupported("a reduction over an empty tensor"));
        }
        self.check_bindings(node)?;
        self.check_inputs_and_types(node, proto)
    }

    /// Every tensor is one storage binding.
    fn check_bindings(&self, node: &Node) -> Result<(), Declined> {
        for t in node
            .inputs
            .iter()
            .flatten()
            .chain(node.outputs.iter().flatten())
        {
            let tensor = self.graph.tensor(*t);
            if let Some(bytes) = tensor.size_bytes().filter(|&b| b > self.max_binding) {
                return Err(unsupported(format!(
                    "'{}' ({} MB) exceeds the device's largest storage binding ({} MB)",
                    tensor.name,
                    bytes >> 20,
                    self.max_binding >> 20
                )));
            }
        }
        Ok(())
    }

    /// Shape-like inputs constant; the other inputs and the outputs of one
    /// float type (Cast: any float in, any float out), ranks within
    /// [`ops::MAX_RANK`].
    fn check_inputs_and_types(&self, node: &Node, proto: &NodeProto) -> Result<(), Declined> {
        let consts = ops::const_inputs(proto);
        let is_cast = proto.op_type() == "Cast";
        let mut node_elem: Option<ElemType> = None;
        let mut same_type = |elem: ElemType| match node_elem {
            _ if is_cast => Ok(()),
            Some(e) if e != elem => Err(unsupported("float and float16 tensors mixed")),
            _ => {
                node_elem = Some(elem);
                Ok(())
            }
        };
        for (i, t) in node.inputs.iter().enumerate() {
            let Some(t) = t else { continue };
            let tensor = self.graph.tensor(*t);
            if consts.contains(&i) {
                if self.graph.node(tensor.producer).kind != NodeKind::Constant {
                    return Err(unknown(format!(
                        "input '{}' is not a constant",
                        tensor.name
                    )));
                }
                continue;
            }
            same_type(self.float_type("input", tensor)?)?;
            if tensor
                .shape
                .as_ref()
                .is_some_and(|s| s.len() > ops::MAX_RANK)
            {
                return Err(unsupported(format!("rank above {}", ops::MAX_RANK)));
            }
        }
        for t in node.outputs.iter().flatten() {
            same_type(self.float_type("output", self.graph.tensor(*t))?)?;
        }
        Ok(())
    }

    /// The tensor's element type, if a float type the adapter stores.
    fn float_type(&self, what: &str, tensor: &Tensor) -> Result<ElemType, Declined> {
        let floats: &[ElemType] = if self.half {
            &[ElemType::FLOAT, ElemType::FLOAT16]
        } else {
            &[ElemType::FLOAT]
        };
        tensor
            .elem_type
            .filter(|e| floats.contains(e))
            .ok_or_else(|| {
                unsupported(format!(
                    "{what} '{}' is {} ({})",
                    tensor.name,
                    tensor.type_string(),
                    if self.half {
                        "f32 or f16 only"
                    } else {
                        "f32 only: no shader-f16"
                    }
                ))
            })
    }
}

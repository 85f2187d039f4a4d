//! A model without its weights, for QueryNetwork: which nodes a device
//! runs, and the types and shapes of its tensors, depend on the graph and
//! on the weights' types and shapes, not on their bytes. Every
//! initializer, and every `Constant` node's value, larger than
//! [`ELIDE_ABOVE`] becomes a graph input of the same type and shape (what a
//! backend builds and types alike), and the model's metadata lists them
//! under [`ELIDED_KEY`]; small ones stay: shapes, axes and scales that
//! kernels and rules read, and per-channel parameters that a backend folds
//! into its kernels (tract takes a BatchNormalization's scale, bias, mean
//! and variance only as constants: 16,384 channels of f32 is 64 KiB). A
//! worker asked about a model far bigger than its memory receives a few
//! kilobytes per node.

use super::proto::{ModelProto, StringStringEntryProto, TensorProto};
use super::tensor_info;

/// Weights larger than this many bytes are left out of a skeleton.
pub const ELIDE_ABOVE: usize = 64 << 10;

/// Metadata key listing the initializers a skeleton left out, one name
/// per line.
pub const ELIDED_KEY: &str = "tessera.elided_weights";

fn data_len(t: &TensorProto) -> usize {
    t.raw_data.as_ref().map_or(0, |b| b.len())
        + t.float_data.len() * 4
        + t.int32_data.len() * 4
        + t.int64_data.len() * 8
        + t.double_data.len() * 8
        + t.uint64_data.len() * 8
        + t.string_data.iter().map(Vec::len).sum::<usize>()
}

/// `model` with its large weights turned into typed graph inputs (see the
/// module doc). A model with none is returned as it is.
pub fn skeleton(model: &ModelProto) -> ModelProto {
    let mut out = model.clone();
    let Some(g) = out.graph.as_mut() else {
        return out;
    };
    let (mut large, kept): (Vec<TensorProto>, Vec<TensorProto>) =
        std::mem::take(&mut g.initializer)
            .into_iter()
            .partition(|t| {
                data_len(t) > ELIDE_ABOVE && t.name.as_deref().is_some_and(|n| !n.is_empty())
            });
    g.initializer = kept;
    large.extend(large_constant_nodes(g));
    if large.is_empty() {
        return out;
    }
    let mut names = Vec::with_capacity(large.len());
    for t in large {
        let name = t.name.clone().unwrap_or_default();
        // Before IR 4 (or where it is overridable) it is a graph input
        // already: that declaration stays.
        if !g
            .input
            .iter()
            .any(|v| v.name.as_deref() == Some(name.as_str()))
        {
            g.input
                .push(tensor_info(&name, t.data_type.unwrap_or(0), &t.dims));
        }
        names.push(name);
    }
    out.metadata_props.push(StringStringEntryProto {
        key: Some(ELIDED_KEY.into()),
        value: Some(names.join("\n")),
    });
    out
}

/// Removes the `Constant` nodes whose value is larger than [`ELIDE_ABOVE`]
/// (and is not a graph output) and returns their values, named after
/// their outputs, without their bytes.
fn large_constant_nodes(g: &mut super::proto::GraphProto) -> Vec<TensorProto> {
    let outputs: std::collections::HashSet<String> =
        g.output.iter().filter_map(|v| v.name.clone()).collect();
    let mut taken = Vec::new();
    g.node.retain(|n| {
        let value = (n.op_type.as_deref() == Some("Constant") && n.input.is_empty())
            .then(|| super::attr::attr(n, "value").and_then(|a| a.t.as_ref()))
            .flatten();
        let name = n
            .output
            .first()
            .filter(|o| !o.is_empty() && !outputs.contains(*o));
        match (value, name) {
            (Some(t), Some(name)) if data_len(t) > ELIDE_ABOVE => {
                taken.push(TensorProto {
                    name: Some(name.clone()),
                    dims: t.dims.clone(),
                    data_type: t.data_type,
                    ..Default::default()
                });
                false
            }
            _ => true,
        }
    });
    taken
}

/// The weights a skeleton left out (empty for a whole model).
pub fn elided(model: &ModelProto) -> Vec<String> {
    model
        .metadata_props
        .iter()
        .filter(|p| p.key.as_deref() == Some(ELIDED_KEY))
        .filter_map(|p| p.value.as_deref())
        .flat_map(|v| v.lines().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Graph;

    #[test]
    fn a_skeleton_keeps_the_graph_types_and_small_constants() {
        // 3 layers of 256×256 f32 weights: 256 KiB each, over the threshold.
        let model = crate::synth::matmul_chain(3, 256, 1);
        let whole = crate::onnx::encode_model(&model).len();
        let bones = skeleton(&model);
        let encoded = crate::onnx::encode_model(&bones).len();
        assert!(encoded < 2048, "{encoded} bytes of {whole}");
        assert_eq!(elided(&bones), ["w1", "w2", "w3"]);
        assert!(elided(&model).is_empty());
        let a = Graph::from_model(model).unwrap();
        let b = Graph::from_model(bones).unwrap();
        assert_eq!(a.op_count(), b.op_count());
        for t in &a.tensors {
            let u = b.tensor(b.tensor_by_name(&t.name).unwrap());
            assert_eq!(
                (&t.elem_type, &t.shape),
                (&u.elem_type, &u.shape),
                "{}",
                t.name
            );
        }
        // The small CNN's biases (64 bytes) stay constants.
        let cnn = skeleton(&crate::synth::small_cnn(1));
        let kept: Vec<_> = cnn
            .graph
            .unwrap()
            .initializer
            .into_iter()
            .filter_map(|t| t.name)
            .collect();
        assert!(kept.contains(&"conv1.b".to_string()), "{kept:?}");
    }
}

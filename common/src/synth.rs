//! Synthetic models for tests and benchmarks: ONNX models built from edge
//! lists (every node a `Sum` of its predecessors, so the model is valid and
//! runs in onnxruntime), random layered and irregular DAGs, and a small
//! deterministic PRNG so results repeat across runs and machines.

use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto};

/// SplitMix64: tiny, deterministic, good enough for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as u64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

/// A DAG as a node count and edges `(from, to)` with `from < to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    pub nodes: usize,
    pub edges: Vec<(u32, u32)>,
}

/// A layered DAG: `nodes` spread over layers of about `width` nodes; each
/// node has 1–3 inputs from the previous one or two layers.
pub fn layered_dag(nodes: usize, width: usize, rng: &mut Rng) -> Dag {
    let width = width.max(1);
    let mut edges = Vec::with_capacity(nodes * 2);
    for v in width..nodes {
        let layer_start = v / width * width;
        let lo = layer_start.saturating_sub(2 * width);
        let span = (layer_start - lo) as u64;
        let k = 1 + rng.below(3);
        for _ in 0..k {
            let u = lo as u64 + rng.below(span);
            edges.push((u as u32, v as u32));
        }
    }
    edges.sort_unstable();
    edges.dedup();
    Dag { nodes, edges }
}

/// An irregular DAG: each node reads 0–3 random earlier nodes, biased to
/// recent ones, with occasional long skip edges.
pub fn irregular_dag(nodes: usize, rng: &mut Rng) -> Dag {
    let mut edges = Vec::new();
    for v in 1..nodes as u64 {
        let k = rng.below(4);
        for _ in 0..k {
            let u = if rng.chance(0.2) {
                rng.below(v)
            } else {
                v - 1 - rng.below(v.min(6))
            };
            edges.push((u as u32, v as u32));
        }
    }
    edges.sort_unstable();
    edges.dedup();
    Dag { nodes, edges }
}

pub use crate::onnx::tensor_info;

/// A node of the default domain.
pub fn node(name: &str, op_type: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.to_string()),
        op_type: Some(op_type.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A valid ONNX model with one node per DAG node: node `i` is named
/// `names[i]` (or `n<i>`), computes `Sum` of its predecessors' outputs (or
/// of the graph input `x` for sources) and writes tensor `t<i>`. Nodes
/// without successors are graph outputs. All tensors are `float[4]`.
pub fn model_from_dag(dag: &Dag, names: Option<&[&str]>) -> ModelProto {
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); dag.nodes];
    let mut has_succ = vec![false; dag.nodes];
    for &(a, b) in &dag.edges {
        preds[b as usize].push(a);
        has_succ[a as usize] = true;
    }
    let mut g = GraphProto {
        name: Some("synthetic".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[4]));
    for (i, p) in preds.iter().enumerate() {
        let input = if p.is_empty() {
            vec!["x".to_string()]
        } else {
            p.iter().map(|u| format!("t{u}")).collect()
        };
        g.node.push(NodeProto {
            name: Some(
                names
                    .and_then(|n| n.get(i))
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("n{i}")),
            ),
            op_type: Some("Sum".into()),
            input,
            output: vec![format!("t{i}")],
            ..Default::default()
        });
        if !has_succ[i] {
            g.output.push(tensor_info(&format!("t{i}"), 1, &[4]));
        }
    }
    opset17(g)
}

/// `g` as an opset-17 model produced by `tessera-synth`.
/// A model of `g` at opset 17.
pub fn opset17(g: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        producer_name: Some("tessera-synth".into()),
        graph: Some(g),
        ..Default::default()
    }
}

/// `model` with every float32 tensor made float16 (weights, constants,
/// graph inputs, outputs and value infos, `Cast`s to float), as float16
/// deployments of float32 models are made; Resize's `roi` and `scales` stay
/// float32 (the operator requires it). Values beyond f16's range become
/// infinite.
pub fn to_float16(model: &ModelProto) -> ModelProto {
    retype_floats(
        model,
        crate::onnx::ElemType::FLOAT,
        crate::onnx::ElemType::FLOAT16,
    )
}

/// The inverse of [`to_float16`]: float16 tensors made float32 (exactly).
/// `to_float32(&to_float16(m))` is `m` with its weights rounded to f16: what
/// an f16 run of `m` should be compared with.
pub fn to_float32(model: &ModelProto) -> ModelProto {
    retype_floats(
        model,
        crate::onnx::ElemType::FLOAT16,
        crate::onnx::ElemType::FLOAT,
    )
}

/// `model` with its `from` tensors (float or float16) made `to`.
fn retype_floats(
    model: &ModelProto,
    from: crate::onnx::ElemType,
    to: crate::onnx::ElemType,
) -> ModelProto {
    use crate::onnx::proto::{
        attribute_proto::AttributeType, type_proto::Value, AttributeProto, TensorProto,
    };
    use crate::onnx::ElemType;
    use crate::tensor::Tensor;
    let values = |shape: Vec<usize>, v: Vec<f32>, name: &str| -> Option<TensorProto> {
        let t = if to == ElemType::FLOAT16 {
            let v: Vec<half::f16> = v.into_iter().map(half::f16::from_f32).collect();
            Tensor::from_values(shape, &v)
        } else {
            Tensor::from_values(shape, &v)
        };
        t.ok().map(|t| t.to_proto(name))
    };
    let convert = |t: &TensorProto| -> TensorProto {
        Tensor::from_proto(t)
            .ok()
            .filter(|x| x.elem() == from)
            .and_then(|x| values(x.shape().to_vec(), x.float_values()?, t.name()))
            .unwrap_or_else(|| t.clone())
    };
    let mut m = model.clone();
    let Some(g) = m.graph.as_mut() else {
        return m;
    };
    let keep: std::collections::HashSet<String> = g
        .node
        .iter()
        .filter(|n| n.op_type() == "Resize")
        .flat_map(|n| n.input.iter().skip(1).cloned())
        .collect();
    for init in &mut g.initializer {
        if !keep.contains(init.name()) {
            *init = convert(init);
        }
    }
    for n in &mut g.node {
        let op = n.op_type().to_string();
        let kept = n.output.iter().any(|o| keep.contains(o));
        for a in &mut n.attribute {
            match (op.as_str(), a.name()) {
                ("Constant" | "ConstantOfShape", "value") if !kept => {
                    if let Some(t) = a.t.as_mut() {
                        *t = convert(t);
                    }
                }
                ("Constant", "value_float" | "value_floats")
                    if !kept && from == ElemType::FLOAT =>
                {
                    let (shape, v) = if a.name() == "value_float" {
                        (vec![], vec![a.f()])
                    } else {
                        (vec![a.floats.len()], a.floats.clone())
                    };
                    if let Some(t) = values(shape, v, "") {
                        *a = AttributeProto {
                            name: Some("value".into()),
                            r#type: Some(AttributeType::Tensor as i32),
                            t: Some(t),
                            ..Default::default()
                        };
                    }
                }
                ("Cast", "to") if a.i() == i64::from(from.0) => {
                    a.i = Some(i64::from(to.0));
                }
                _ => {}
            }
        }
    }
    for vi in g
        .input
        .iter_mut()
        .chain(g.output.iter_mut())
        .chain(g.value_info.iter_mut())
    {
        if keep.contains(vi.name()) {
            continue;
        }
        if let Some(Value::TensorType(t)) = vi.r#type.as_mut().and_then(|t| t.value.as_mut()) {
            if t.elem_type == Some(from.0) {
                t.elem_type = Some(to.0);
            }
        }
    }
    m
}

/// Seeded inputs for every graph input of `graph`: dynamic dims are 1 for
/// the first (batch) and 64 for the others; floats uniform in [-1, 1),
/// integers in [0, 256), booleans fair. `None` for an input whose type or
/// rank is unknown or not numeric.
pub fn random_inputs(
    graph: &crate::graph::Graph,
    seed: u64,
) -> Option<Vec<(String, crate::tensor::Tensor)>> {
    use crate::onnx::ElemType;
    use crate::tensor::Tensor;
    let mut rng = Rng::new(seed);
    graph
        .inputs
        .iter()
        .map(|&t| {
            let t = graph.tensor(t);
            let shape: Vec<usize> = t
                .shape
                .as_ref()?
                .iter()
                .enumerate()
                .map(|(k, d)| {
                    d.known()
                        .and_then(|v| usize::try_from(v).ok())
                        .unwrap_or(if k == 0 { 1 } else { 64 })
                })
                .collect();
            let n: usize = shape.iter().product();
            let tensor = match t.elem_type? {
                ElemType::FLOAT => Tensor::from_values(
                    shape,
                    &(0..n)
                        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
                        .collect::<Vec<_>>(),
                ),
                ElemType::INT32 => Tensor::from_values(
                    shape,
                    &(0..n).map(|_| rng.below(256) as i32).collect::<Vec<_>>(),
                ),
                ElemType::INT64 => Tensor::from_values(
                    shape,
                    &(0..n).map(|_| rng.below(256) as i64).collect::<Vec<_>>(),
                ),
                ElemType::UINT8 => Tensor::from_values(
                    shape,
                    &(0..n).map(|_| rng.below(256) as u8).collect::<Vec<_>>(),
                ),
                ElemType::BOOL => {
                    Tensor::from_values(shape, &(0..n).map(|_| rng.chance(0.5)).collect::<Vec<_>>())
                }
                _ => return None,
            }
            .ok()?;
            Some((t.name.clone(), tensor))
        })
        .collect()
}

/// A small image classifier with a real CNN shape, for the README's main
/// job and the cluster tests: `image` `float[1,3,64,64]` → three Conv+Relu
/// stages (two with MaxPool), GlobalAveragePool, Flatten, Gemm to 10
/// classes, Softmax → `probs` `float[1,10]`. Weights are seeded uniform in
/// ±sqrt(6/fan_in), so every `seed` gives the same model on any machine.
/// Node names: conv1 relu1 pool1 conv2 relu2 pool2 conv3 relu3 gap flatten
/// fc softmax.
pub fn small_cnn(seed: u64) -> ModelProto {
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto};
    use crate::tensor::Tensor;

    let mut rng = Rng::new(seed);
    let mut g = GraphProto {
        name: Some("small_cnn".into()),
        ..Default::default()
    };
    let mut weight = |g: &mut GraphProto, name: &str, shape: &[usize], fan_in: usize| {
        let bound = (6.0 / fan_in as f64).sqrt();
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound)
            .map(|v| v as f32)
            .collect();
        #[allow(
            clippy::expect_used,
            reason = "the values are made to the shape's size just above"
        )]
        let t = Tensor::from_values(shape.to_vec(), &values).expect("sizes match by construction");
        g.initializer.push(t.to_proto(name));
    };
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: Some(name.into()),
        ints: v.to_vec(),
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    };
    let with = |mut n: NodeProto, attrs: Vec<AttributeProto>| {
        n.attribute = attrs;
        n
    };
    g.input.push(tensor_info("image", 1, &[1, 3, 64, 64]));
    let mut input = "image".to_string();
    for (i, (cin, cout, pool)) in [(3, 16, true), (16, 32, true), (32, 32, false)]
        .into_iter()
        .enumerate()
    {
        let k = i + 1;
        let (w, b) = (format!("conv{k}.w"), format!("conv{k}.b"));
        weight(&mut g, &w, &[cout, cin, 3, 3], cin * 9);
        weight(&mut g, &b, &[cout], cin * 9);
        let conv = format!("conv{k}");
        g.node.push(with(
            node(&conv, "Conv", &[&input, &w, &b], &[&conv]),
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
        ));
        let relu = format!("relu{k}");
        g.node.push(node(&relu, "Relu", &[&conv], &[&relu]));
        input = relu;
        if pool {
            let p = format!("pool{k}");
            g.node.push(with(
                node(&p, "MaxPool", &[&input], &[&p]),
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
            ));
            input = p;
        }
    }
    g.node
        .push(node("gap", "GlobalAveragePool", &[&input], &["gap"]));
    g.node
        .push(node("flatten", "Flatten", &["gap"], &["flatten"]));
    weight(&mut g, "fc.w", &[10, 32], 32);
    weight(&mut g, "fc.b", &[10], 32);
    let mut fc = node("fc", "Gemm", &["flatten", "fc.w", "fc.b"], &["logits"]);
    fc.attribute.push(AttributeProto {
        name: Some("transB".into()),
        i: Some(1),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    });
    g.node.push(fc);
    g.node
        .push(node("softmax", "Softmax", &["logits"], &["probs"]));
    g.output.push(tensor_info("probs", 1, &[1, 10]));
    opset17(g)
}

/// A chain of `layers` fully connected layers, the simplest model whose
/// weights outgrow a machine: `x` `float[batch,dim]` → (MatMul by a seeded
/// `dim`×`dim` weight, Relu) × `layers` → `y` `float[batch,dim]`, the batch
/// dimension dynamic. Weights are uniform in ±sqrt(6/dim), so values keep
/// their scale through the layers. Node names `mm1`, `relu1`, `mm2`, ...;
/// weights `w1`, `w2`, ... (`dim`² × 4 bytes each: 2048 gives 16 MiB).
pub fn matmul_chain(layers: usize, dim: usize, seed: u64) -> ModelProto {
    let mut rng = Rng::new(seed);
    let bound = (6.0 / dim as f64).sqrt();
    chain_of(layers, dim, |n| {
        let values: Vec<f32> = (0..n)
            .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound)
            .map(|v| v as f32)
            .collect();
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    })
}

/// [`matmul_chain`] with zero weights, made without touching their memory
/// (zeroed pages are not resident until read): a model of any size for
/// planning at scale, which reads weights' types and shapes only.
pub fn matmul_chain_zeros(layers: usize, dim: usize) -> ModelProto {
    chain_of(layers, dim, |n| vec![0u8; n * 4])
}

/// The chain with each `dim`×`dim` f32 weight's bytes from `weight(numel)`.
fn chain_of(layers: usize, dim: usize, mut weight: impl FnMut(usize) -> Vec<u8>) -> ModelProto {
    let mut g = GraphProto {
        name: Some("matmul_chain".into()),
        ..Default::default()
    };
    let batch = crate::onnx::proto::tensor_shape_proto::Dimension {
        denotation: None,
        value: Some(
            crate::onnx::proto::tensor_shape_proto::dimension::Value::DimParam("batch".into()),
        ),
    };
    let with_batch = |name: &str| {
        let mut v = tensor_info(name, 1, &[1, dim as i64]);
        if let Some(crate::onnx::proto::type_proto::Value::TensorType(t)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            if let Some(s) = t.shape.as_mut() {
                s.dim[0] = batch.clone();
            }
        }
        v
    };
    g.input.push(with_batch("x"));
    let mut input = "x".to_string();
    for k in 1..=layers {
        let w = format!("w{k}");
        g.initializer.push(crate::onnx::proto::TensorProto {
            name: Some(w.clone()),
            dims: vec![dim as i64, dim as i64],
            data_type: Some(1),
            raw_data: Some(weight(dim * dim).into()),
            ..Default::default()
        });
        let (mm, relu) = (format!("mm{k}"), format!("relu{k}"));
        g.node.push(node(&mm, "MatMul", &[&input, &w], &[&mm]));
        let out = if k == layers {
            "y".to_string()
        } else {
            relu.clone()
        };
        g.node.push(node(&relu, "Relu", &[&mm], &[&out]));
        input = out;
    }
    g.output.push(with_batch("y"));
    opset17(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::ElemType;
    use crate::tensor::Tensor;

    /// Element types of every initializer and graph input/output.
    fn elems(m: &ModelProto) -> Vec<i32> {
        let g = m.graph.as_ref().unwrap();
        let io = g.input.iter().chain(&g.output).map(|v| {
            match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(crate::onnx::proto::type_proto::Value::TensorType(t)) => t.elem_type(),
                _ => 0,
            }
        });
        g.initializer
            .iter()
            .map(|t| t.data_type())
            .chain(io)
            .collect()
    }

    #[test]
    fn float16_conversion_rounds_weights_and_converts_back_exactly() {
        let m = small_cnn(3);
        assert!(elems(&m).contains(&ElemType::FLOAT.0));
        let half = to_float16(&m);
        assert!(!elems(&half).contains(&ElemType::FLOAT.0));
        assert!(elems(&half).contains(&ElemType::FLOAT16.0));
        let back = to_float32(&half);
        assert_eq!(elems(&back), elems(&m));
        let g = (m.graph.as_ref().unwrap(), back.graph.as_ref().unwrap());
        for (a, b) in g.0.initializer.iter().zip(&g.1.initializer) {
            let (a, b) = (
                Tensor::from_proto(a).unwrap(),
                Tensor::from_proto(b).unwrap(),
            );
            let (a, b) = (a.float_values().unwrap(), b.float_values().unwrap());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(half::f16::from_f32(*x).to_f32(), *y);
            }
        }
    }
}

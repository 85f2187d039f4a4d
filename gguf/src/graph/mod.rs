//! The ONNX decoder built from a GGUF's weights ([`weights`]):
//! onnxruntime's fused operators (`MatMulNBits` keeping each weight's
//! blocks, `GroupQueryAttention` with RoPE inside,
//! `SkipSimplifiedLayerNormalization`) or Tessera's kernels over the
//! file's blocks, and the logits of the last position only ([`decoder`]),
//! in the
//! interface of a generative folder's `model.onnx`: inputs `input_ids`,
//! `attention_mask`, `position_ids`, `past_key_values.N.key/.value`;
//! outputs `logits`, `present.N.key/.value`.

mod attention;
pub mod decoder;
pub mod embedding;
mod ffn;
mod linear;
mod norm;
pub mod weights;

use std::collections::HashSet;

use bytes::Bytes;
use tessera_common::onnx::proto::{
    attribute_proto::AttributeType, tensor_proto::DataLocation, AttributeProto, NodeProto,
    TensorProto,
};
use tessera_common::onnx::ElemType;

/// onnxruntime's contrib operators' domain.
pub const MS_DOMAIN: &str = "com.microsoft";

/// A node attribute.
pub enum Attr<'a> {
    Int(&'a str, i64),
    Ints(&'a str, &'a [i64]),
    Float(&'a str, f32),
    Str(&'a str, &'a str),
}

impl Attr<'_> {
    fn proto(&self) -> AttributeProto {
        let mut a = AttributeProto::default();
        match self {
            Attr::Int(n, v) => {
                a.name = Some(n.to_string());
                a.i = Some(*v);
                a.r#type = Some(AttributeType::Int as i32);
            }
            Attr::Ints(n, v) => {
                a.name = Some(n.to_string());
                a.ints = v.to_vec();
                a.r#type = Some(AttributeType::Ints as i32);
            }
            Attr::Float(n, v) => {
                a.name = Some(n.to_string());
                a.f = Some(*v);
                a.r#type = Some(AttributeType::Float as i32);
            }
            Attr::Str(n, v) => {
                a.name = Some(n.to_string());
                a.s = Some(v.as_bytes().to_vec());
                a.r#type = Some(AttributeType::String as i32);
            }
        }
        a
    }
}

/// Collects nodes and initializers; each op returns its output's name.
pub struct GraphBuilder {
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    names: HashSet<String>,
    constants: HashSet<String>,
    /// `MatMulNBits`' accuracy level: 4 computes with int8 activations
    /// (onnxruntime's fast kernels), 0 in float32.
    pub accuracy_level: i64,
    /// Activations as llama.cpp's CPU backend computes them where it
    /// rounds beyond float32 (GELU through its float16 table), beside
    /// Tessera's kernels; else exact float32.
    pub ggml_rounding: bool,
}

impl GraphBuilder {
    pub fn new(accuracy_level: i64) -> GraphBuilder {
        GraphBuilder {
            nodes: Vec::new(),
            initializers: Vec::new(),
            names: HashSet::new(),
            constants: HashSet::new(),
            accuracy_level,
            ggml_rounding: false,
        }
    }

    /// Whether a node of this name exists.
    pub fn made(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// A node of the default domain with one output, `{name}/output_0`.
    pub fn op(&mut self, op: &str, inputs: &[&str], name: &str, attrs: &[Attr]) -> String {
        let out = format!("{name}/output_0");
        self.node(op, "", inputs, name, &[out.as_str()], attrs);
        out
    }

    /// A node whose single output has a given name.
    pub fn op_to(&mut self, op: &str, inputs: &[&str], name: &str, output: &str, attrs: &[Attr]) {
        self.node(op, "", inputs, name, &[output], attrs);
    }

    /// A node of onnxruntime's contrib domain with one output.
    pub fn ms_op(&mut self, op: &str, inputs: &[&str], name: &str, attrs: &[Attr]) -> String {
        let out = format!("{name}/output_0");
        self.node(op, MS_DOMAIN, inputs, name, &[out.as_str()], attrs);
        out
    }

    /// Any node ("" for an input or output left out).
    pub fn node(
        &mut self,
        op: &str,
        domain: &str,
        inputs: &[&str],
        name: &str,
        outputs: &[&str],
        attrs: &[Attr],
    ) {
        // Names come from the builder alone (never from the file): a name
        // made twice is the builder's bug.
        assert!(self.names.insert(name.to_string()), "node {name} twice");
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: Some(name.to_string()),
            op_type: Some(op.to_string()),
            domain: (!domain.is_empty()).then(|| domain.to_string()),
            attribute: attrs.iter().map(Attr::proto).collect(),
            ..Default::default()
        });
    }

    /// An initializer of raw little-endian bytes.
    pub fn weight(&mut self, name: &str, elem: ElemType, dims: &[usize], data: Bytes) -> String {
        debug_assert_eq!(
            elem.data_len(dims.iter().product::<usize>() as u64),
            Some(data.len() as u64),
            "{name}"
        );
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(elem.0),
            name: Some(name.to_string()),
            raw_data: Some(data),
            data_location: Some(DataLocation::Default as i32),
            ..Default::default()
        });
        name.to_string()
    }

    /// A float32 initializer.
    pub fn floats(&mut self, name: &str, dims: &[usize], values: &[f32]) -> String {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.weight(name, ElemType::FLOAT, dims, bytes.into())
    }

    /// A small int64 constant (shapes, axes), named by its values and
    /// shared.
    pub fn ints(&mut self, values: &[i64]) -> String {
        let text: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let name = format!("/model/constants/int64_{}", text.join("_"));
        if self.constants.insert(name.clone()) {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.weight(&name, ElemType::INT64, &[values.len()], bytes.into());
        }
        name
    }

    /// A scalar constant of `elem` (float32, int32, int64 or uint8), shared.
    pub fn scalar(&mut self, elem: ElemType, value: f64) -> String {
        let name = format!(
            "/model/constants/{}_scalar_{value}",
            elem.name().to_lowercase()
        );
        if self.constants.insert(name.clone()) {
            let bytes: Vec<u8> = match elem {
                ElemType::FLOAT => (value as f32).to_le_bytes().to_vec(),
                ElemType::INT32 => (value as i32).to_le_bytes().to_vec(),
                ElemType::INT64 => (value as i64).to_le_bytes().to_vec(),
                ElemType::UINT8 => vec![value as u8],
                _ => unreachable!("scalars of {elem} are not made"),
            };
            self.weight(&name, elem, &[], bytes.into());
        }
        name
    }

    /// `x` cast to float32.
    pub fn to_float(&mut self, x: &str, name: &str) -> String {
        self.op(
            "Cast",
            &[x],
            name,
            &[Attr::Int("to", ElemType::FLOAT.0 as i64)],
        )
    }
}

//! Writing an expansion: nodes named `<original>.d<k>`, intermediate tensors
//! `<original>.d<k>:<j>`, constants as initializers `<original>.c<k>`, and
//! the opset-dependent forms of the ops rules use (Squeeze, Unsqueeze and the
//! Reduce ops take their axes as an input from opset 13 / 18 on).

use crate::declined::{unsupported, Declined};
use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto};
use crate::onnx::ElemType;
use crate::tensor::{Element, Tensor};

/// The expansion being written for one original node.
pub struct Emit {
    origin: String,
    opset: i64,
    nodes: Vec<NodeProto>,
    constants: Vec<TensorProto>,
}

/// An attribute for [`Emit::op`].
pub enum Attr<'a> {
    Int(&'a str, i64),
    Ints(&'a str, Vec<i64>),
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
                a.ints = v.clone();
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

impl Emit {
    pub(super) fn new(origin: &str, opset: i64) -> Emit {
        Emit {
            origin: origin.to_string(),
            opset,
            nodes: Vec::new(),
            constants: Vec::new(),
        }
    }

    pub(super) fn finish(self) -> (Vec<NodeProto>, Vec<TensorProto>) {
        (self.nodes, self.constants)
    }

    /// Adds a node writing `outputs` (given names; `None`: a fresh name).
    /// Returns the output names.
    pub fn op_into(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: &[Attr],
        outputs: &[Option<&str>],
    ) -> Vec<String> {
        let name = format!("{}.d{}", self.origin, self.nodes.len());
        let outputs: Vec<String> = outputs
            .iter()
            .enumerate()
            .map(|(j, o)| {
                o.map(str::to_string)
                    .unwrap_or_else(|| format!("{name}:{j}"))
            })
            .collect();
        self.nodes.push(NodeProto {
            name: Some(name),
            op_type: Some(op.to_string()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.clone(),
            attribute: attrs.iter().map(Attr::proto).collect(),
            ..Default::default()
        });
        outputs
    }

    /// Adds a one-output node and returns its output's (fresh) name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: &[Attr]) -> String {
        self.op_into(op, inputs, attrs, &[None]).remove(0)
    }

    /// A constant initializer.
    pub fn constant<T: Element>(
        &mut self,
        dims: &[usize],
        values: &[T],
    ) -> Result<String, Declined> {
        let name = format!("{}.c{}", self.origin, self.constants.len());
        let t =
            Tensor::from_values(dims.to_vec(), values).map_err(|e| unsupported(e.to_string()))?;
        self.constants.push(t.to_proto(&name));
        Ok(name)
    }

    /// `Cast(x, to)`.
    pub fn cast(&mut self, x: &str, to: ElemType) -> String {
        self.op("Cast", &[x], &[Attr::Int("to", i64::from(to.0))])
    }

    /// `Cast(x, to)` written into `y`.
    pub fn cast_into(&mut self, x: &str, to: ElemType, y: &str) {
        self.op_into(
            "Cast",
            &[x],
            &[Attr::Int("to", i64::from(to.0))],
            &[Some(y)],
        );
    }

    /// `x` (a float32 tensor) as `elem`: itself when `elem` is float32.
    pub fn from_f32(&mut self, x: String, elem: ElemType) -> String {
        if elem == ElemType::FLOAT {
            x
        } else {
            self.cast(&x, elem)
        }
    }

    /// A float scalar of element type `elem` (a float32 constant, cast).
    pub fn float_scalar(&mut self, v: f32, elem: ElemType) -> Result<String, Declined> {
        let c = self.constant::<f32>(&[], &[v])?;
        Ok(self.from_f32(c, elem))
    }

    /// `Unsqueeze(x, axes)` in the model's opset.
    pub fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> Result<String, Declined> {
        self.with_axes("Unsqueeze", x, axes, 13, &[])
    }

    /// `Squeeze(x, axes)` in the model's opset.
    pub fn squeeze(&mut self, x: &str, axes: &[i64]) -> Result<String, Declined> {
        self.with_axes("Squeeze", x, axes, 13, &[])
    }

    /// A full reduction to a scalar (`ReduceSum`, `ReduceMean`, ...):
    /// no axes means every axis in every opset.
    pub fn reduce_all(&mut self, op: &str, x: &str) -> String {
        self.op(op, &[x], &[Attr::Int("keepdims", 0)])
    }

    /// `op(x)` over `axes` (a Reduce op; axes an input from opset 18 on).
    pub fn reduce(
        &mut self,
        op: &str,
        x: &str,
        axes: &[i64],
        keepdims: bool,
    ) -> Result<String, Declined> {
        self.with_axes(
            op,
            x,
            axes,
            18,
            &[Attr::Int("keepdims", i64::from(keepdims))],
        )
    }

    fn with_axes(
        &mut self,
        op: &str,
        x: &str,
        axes: &[i64],
        input_since: i64,
        attrs: &[Attr],
    ) -> Result<String, Declined> {
        if self.opset >= input_since {
            let a = self.constant::<i64>(&[axes.len()], axes)?;
            Ok(self.op(op, &[x, &a], attrs))
        } else {
            let mut all: Vec<Attr> = vec![Attr::Ints("axes", axes.to_vec())];
            all.extend(attrs.iter().map(|a| match a {
                Attr::Int(n, v) => Attr::Int(n, *v),
                Attr::Ints(n, v) => Attr::Ints(n, v.clone()),
                Attr::Float(n, v) => Attr::Float(n, *v),
                Attr::Str(n, v) => Attr::Str(n, v),
            }));
            Ok(self.op(op, &[x], &all))
        }
    }

    /// Appends the attributes of `from` to the last node written.
    pub fn copy_attributes(&mut self, from: &NodeProto) {
        if let Some(last) = self.nodes.last_mut() {
            last.attribute.extend(from.attribute.iter().cloned());
        }
    }

    /// Appends the attributes of `from` but those named in `skip` to the
    /// last node written.
    pub fn copy_attributes_except(&mut self, from: &NodeProto, skip: &[&str]) {
        if let Some(last) = self.nodes.last_mut() {
            last.attribute.extend(
                from.attribute
                    .iter()
                    .filter(|a| !skip.contains(&a.name.as_deref().unwrap_or("")))
                    .cloned(),
            );
        }
    }

    /// The model's default-domain opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }
}

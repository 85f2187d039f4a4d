//! Reading a node's attributes and inputs, and a model's opset: the one copy
//! every pass (type inference, folding, decomposition, the plugins' support
//! checks and kernels) uses.

use super::proto::{AttributeProto, ModelProto, NodeProto, TensorProto};

/// Attribute `name` of `node`.
pub fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
}

/// Integer attribute `name`.
pub fn attr_i(node: &NodeProto, name: &str) -> Option<i64> {
    attr(node, name).and_then(|a| a.i)
}

/// Float attribute `name`.
pub fn attr_f(node: &NodeProto, name: &str) -> Option<f32> {
    attr(node, name).and_then(|a| a.f)
}

/// String attribute `name`, where it is UTF-8.
pub fn attr_s<'a>(node: &'a NodeProto, name: &str) -> Option<&'a str> {
    attr(node, name).and_then(|a| std::str::from_utf8(a.s.as_deref()?).ok())
}

/// Integer-list attribute `name` (present but empty: an empty slice).
pub fn attr_ints<'a>(node: &'a NodeProto, name: &str) -> Option<&'a [i64]> {
    attr(node, name).map(|a| a.ints.as_slice())
}

/// Float-list attribute `name`.
pub fn attr_floats<'a>(node: &'a NodeProto, name: &str) -> Option<&'a [f32]> {
    attr(node, name).map(|a| a.floats.as_slice())
}

/// Tensor attribute `name` (`Constant`'s `value`, `ConstantOfShape`'s).
pub fn attr_t<'a>(node: &'a NodeProto, name: &str) -> Option<&'a TensorProto> {
    attr(node, name).and_then(|a| a.t.as_ref())
}

/// Input `k` of `node` where present and not the empty name (ONNX marks an
/// omitted optional input with `""`).
pub fn input(node: &NodeProto, k: usize) -> Option<&str> {
    node.input
        .get(k)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The opset a model without a default-domain import runs at: 1, as the
/// ONNX IR specification gives for models that declare none (loading
/// refuses IR ≥ 3 models that import no opset at all).
pub const UNDECLARED_OPSET: i64 = 1;

/// The model's default-domain (`""` / `ai.onnx`) opset, as it declares it.
pub fn declared_default_opset(model: &ModelProto) -> Option<i64> {
    model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
}

/// The opset the model's default-domain nodes run at.
pub fn default_opset(model: &ModelProto) -> i64 {
    declared_default_opset(model).unwrap_or(UNDECLARED_OPSET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::{attribute_proto::AttributeType, OperatorSetIdProto};

    fn node() -> NodeProto {
        let ints = AttributeProto {
            name: Some("axes".into()),
            ints: vec![0, 2],
            r#type: Some(AttributeType::Ints as i32),
            ..Default::default()
        };
        let mode = AttributeProto {
            name: Some("mode".into()),
            s: Some(b"linear".to_vec()),
            r#type: Some(AttributeType::String as i32),
            ..Default::default()
        };
        NodeProto {
            input: vec!["x".into(), String::new(), "z".into()],
            attribute: vec![ints, mode],
            ..Default::default()
        }
    }

    #[test]
    fn reads_attributes_and_inputs() {
        let n = node();
        assert_eq!(attr_ints(&n, "axes"), Some(&[0i64, 2][..]));
        assert_eq!(attr_s(&n, "mode"), Some("linear"));
        assert_eq!(attr_i(&n, "axes"), None);
        assert_eq!(attr_f(&n, "alpha"), None);
        assert_eq!(input(&n, 0), Some("x"));
        assert_eq!(input(&n, 1), None, "the empty name is an omitted input");
        assert_eq!(input(&n, 2), Some("z"));
        assert_eq!(input(&n, 3), None);
    }

    #[test]
    fn default_opset_reads_either_name_of_the_default_domain() {
        let import = |domain: &str, version| OperatorSetIdProto {
            domain: Some(domain.into()),
            version: Some(version),
        };
        let mut m = ModelProto {
            opset_import: vec![import("com.microsoft", 1), import("ai.onnx", 17)],
            ..Default::default()
        };
        assert_eq!(default_opset(&m), 17);
        m.opset_import = vec![import("", 13)];
        assert_eq!(default_opset(&m), 13);
        m.opset_import = vec![import("com.microsoft", 1)];
        assert_eq!(default_opset(&m), UNDECLARED_OPSET);
    }
}

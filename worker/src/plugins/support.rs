//! Which backends run an op, joined with everything else Tessera knows
//! about it ([`tessera_common::ops`]): one [`OpSupport`] per op type.
//!
//! The GPU plugin runs the op types of its kernel table
//! (`plugins/gpu/ops/`), each within the limits its `check` states; tract
//! runs the op types its ONNX front end registers, minus what its
//! QueryNetwork refuses as known-wrong; onnxruntime has kernels for the
//! whole standard opset, so whether it runs a node is asked node by node
//! (opset, element types, attributes), never listed. A node's real answer
//! is always its device's QueryNetwork; this is the op-level map.
//!
//! # Example
//!
//! ```
//! use tessera_worker::plugins::support;
//!
//! let conv = support::of("Conv");
//! assert!(conv.rules.is_some_and(|r| r.infers_shapes()));
//! # #[cfg(feature = "gpu")]
//! assert!(conv.gpu_kernels.is_some_and(|k| k.contains(&"conv")));
//! ```

use std::collections::BTreeSet;

use tessera_common::ops::{self, OpEntry};

/// What Tessera knows about one op type, and which backends run it.
#[derive(Debug, Clone)]
pub struct OpSupport {
    pub op_type: String,
    /// Its rules (types, shapes, folding, decomposition, cost), if any.
    pub rules: Option<&'static OpEntry>,
    /// The GPU kernels it launches, if the GPU plugin runs it (`None`
    /// also when this build has no GPU plugin).
    pub gpu_kernels: Option<&'static [&'static str]>,
    /// Whether tract parses it (false also when this build has no tract).
    pub tract: bool,
}

/// The support of `op_type` (default domain).
pub fn of(op_type: &str) -> OpSupport {
    OpSupport {
        op_type: op_type.to_string(),
        rules: ops::entry(op_type),
        gpu_kernels: gpu_kernels(op_type),
        tract: tract_ops().contains(op_type),
    }
}

/// Every op type some rule or backend table names, by name.
pub fn all() -> Vec<OpSupport> {
    let mut names: BTreeSet<String> = ops::all().map(|e| e.op_type.to_string()).collect();
    names.extend(gpu_ops().map(str::to_string));
    names.extend(tract_ops().iter().cloned());
    names.iter().map(|op| of(op)).collect()
}

#[cfg(feature = "gpu")]
fn gpu_kernels(op_type: &str) -> Option<&'static [&'static str]> {
    super::gpu::ops::OPS
        .iter()
        .find(|(op, _)| *op == op_type)
        .map(|(_, kernels)| *kernels)
}

#[cfg(not(feature = "gpu"))]
fn gpu_kernels(_op_type: &str) -> Option<&'static [&'static str]> {
    None
}

fn gpu_ops() -> impl Iterator<Item = &'static str> {
    #[cfg(feature = "gpu")]
    let ops: &[(&str, &[&str])] = super::gpu::ops::OPS;
    #[cfg(not(feature = "gpu"))]
    let ops: &[(&str, &[&str])] = &[];
    ops.iter().map(|(op, _)| *op)
}

/// The default-domain op types tract's ONNX front end registers.
fn tract_ops() -> &'static BTreeSet<String> {
    static OPS: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
    OPS.get_or_init(|| {
        #[cfg(feature = "cpu")]
        let ops = tract_onnx::onnx().op_register.0.into_keys().collect();
        #[cfg(not(feature = "cpu"))]
        let ops = BTreeSet::new();
        ops
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_and_rules_meet_in_one_entry() {
        let all = all();
        let names: BTreeSet<&str> = all.iter().map(|s| s.op_type.as_str()).collect();
        // Every op with rules, and every op a backend table lists, once.
        assert!(ops::all().all(|e| names.contains(e.op_type)));
        assert!(gpu_ops().all(|op| names.contains(op)));
        assert_eq!(names.len(), all.len());
        let lp = of("LpPool");
        assert!(lp.rules.is_some_and(|r| r.decomposes()));
        assert!(
            lp.gpu_kernels.is_none(),
            "the GPU runs LpPool only decomposed"
        );
        assert!(of("NoSuchOp").rules.is_none() && !of("NoSuchOp").tract);
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_kernels_come_from_its_table() {
        assert_eq!(of("MatMul").gpu_kernels, Some(&["gemm"][..]));
        assert_eq!(of("Reshape").gpu_kernels, Some(&[][..]));
        assert!(of("Einsum").gpu_kernels.is_none());
    }

    #[cfg(feature = "cpu")]
    #[test]
    fn tract_lists_what_its_front_end_parses() {
        assert!(of("Conv").tract && of("MatMul").tract && of("LSTM").tract);
    }
}

//! One entry per op type: everything Tessera knows about an op of the
//! default ONNX domain, reached from one place. Each concern keeps its
//! rules in files by op family, each with a table from op type to rule —
//! element types (`graph/infer/types.rs`), static shapes
//! (`graph/infer/shapes/`), constant folding (`simplify/fold/`),
//! decomposition into other ops (`decompose/`) and cost
//! (`affinity/cost.rs`) — and this registry joins them by op type, once.
//! Every lookup of a rule by op type goes through [`entry`]. Which
//! backends run an op is worker-side knowledge (`common` knows no
//! backend): `tessera_worker::plugins::support` joins this entry with the
//! backends' op tables, and each node's answer is its device's
//! QueryNetwork.
//!
//! # Example
//!
//! ```
//! use tessera_common::affinity::CostRule;
//! use tessera_common::ops;
//!
//! let conv = ops::entry("Conv").expect("a known op");
//! assert!(conv.infers_types() && conv.infers_shapes());
//! assert_eq!(conv.cost, CostRule::Conv);
//! assert!(ops::entry("Add").is_some_and(|e| e.folds()));
//! assert!(ops::entry("LpPool").is_some_and(|e| e.decomposes()));
//! assert!(ops::entry("NoSuchOp").is_none());
//! ```

use std::collections::BTreeMap;

/// The domain of Tessera's own operators over llama.cpp's weight blocks
/// (`MatMul`, `Gather`), which the onnxruntime plugin registers; their
/// outputs are float32.
pub const GGML_DOMAIN: &str = "ai.tessera.ggml";
use std::sync::OnceLock;

use crate::affinity::CostRule;
use crate::graph::infer::{shapes, types};

/// What Tessera knows about one op type.
#[derive(Clone, Copy)]
pub struct OpEntry {
    pub op_type: &'static str,
    /// How its FLOPs follow from its shapes.
    pub cost: CostRule,
    pub(crate) types: Option<types::Rule>,
    pub(crate) shape: Option<shapes::Rule>,
    pub(crate) fold: Option<crate::simplify::fold::Rule>,
    pub(crate) decompose: Option<crate::decompose::Rule>,
}

impl OpEntry {
    fn new(op_type: &'static str) -> OpEntry {
        OpEntry {
            op_type,
            cost: CostRule::PerOutput(1.0),
            types: None,
            shape: None,
            fold: None,
            decompose: None,
        }
    }

    /// Whether its outputs' element types are derived.
    pub fn infers_types(&self) -> bool {
        self.types.is_some()
    }

    /// Whether its outputs' static shapes are derived.
    pub fn infers_shapes(&self) -> bool {
        self.shape.is_some()
    }

    /// Whether it is folded when its inputs are constant.
    pub fn folds(&self) -> bool {
        self.fold.is_some()
    }

    /// Whether a backend that lacks it can run its decomposition.
    pub fn decomposes(&self) -> bool {
        self.decompose.is_some()
    }
}

impl std::fmt::Debug for OpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpEntry")
            .field("op_type", &self.op_type)
            .field("cost", &self.cost)
            .field("types", &self.infers_types())
            .field("shapes", &self.infers_shapes())
            .field("folds", &self.folds())
            .field("decomposes", &self.decomposes())
            .finish()
    }
}

fn registry() -> &'static BTreeMap<&'static str, OpEntry> {
    static REGISTRY: OnceLock<BTreeMap<&'static str, OpEntry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut all: BTreeMap<&'static str, OpEntry> = BTreeMap::new();
        fn at<'a>(
            all: &'a mut BTreeMap<&'static str, OpEntry>,
            op: &'static str,
        ) -> &'a mut OpEntry {
            all.entry(op).or_insert_with(|| OpEntry::new(op))
        }
        for (op, rule) in types::rules() {
            at(&mut all, op).types = Some(rule);
        }
        for (op, rule) in shapes::rules() {
            at(&mut all, op).shape = Some(rule);
        }
        for (op, rule) in crate::simplify::fold::rules() {
            at(&mut all, op).fold = Some(rule);
        }
        for (op, rule) in crate::decompose::rules() {
            at(&mut all, op).decompose = Some(rule);
        }
        for &(op, rule) in crate::affinity::cost::RULES {
            at(&mut all, op).cost = rule;
        }
        all
    })
}

/// The entry of `op_type` (default domain), if any rule knows it.
pub fn entry(op_type: &str) -> Option<&'static OpEntry> {
    registry().get(op_type)
}

/// Every op type some rule knows, by name.
pub fn all() -> impl Iterator<Item = &'static OpEntry> {
    registry().values()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_joined_by_op_type() {
        let count = |f: fn(&OpEntry) -> bool| all().filter(|e| f(e)).count();
        assert_eq!(
            count(OpEntry::folds),
            crate::simplify::fold::foldable_ops().count()
        );
        assert_eq!(
            count(OpEntry::decomposes),
            crate::decompose::rules().count()
        );
        assert!(count(OpEntry::infers_types) >= 150);
        assert!(count(OpEntry::infers_shapes) >= 100);
        let free = all().filter(|e| e.cost == CostRule::Free).count();
        assert!(free >= 20, "{free}");
    }

    #[test]
    fn an_entry_holds_each_concern() {
        let matmul = entry("MatMul").unwrap();
        assert_eq!(matmul.cost, CostRule::MatMul);
        assert!(matmul.infers_types() && matmul.infers_shapes());
        let reshape = entry("Reshape").unwrap();
        assert_eq!(reshape.cost, CostRule::Free);
        assert!(reshape.folds());
        // An op only a type rule knows costs one FLOP per output element.
        let relu = entry("Relu").unwrap();
        assert_eq!(relu.cost, CostRule::PerOutput(1.0));
        assert!(format!("{relu:?}").contains("Relu"));
    }
}

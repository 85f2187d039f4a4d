//! A decoder's layers, where its model declares them: metadata
//! `tessera.layer_prefix` names the prefix of every node of layer N
//! (`{prefix}{N}/…`, e.g. `/model/layers.` as Tessera's GGUF builder names
//! them). A pipeline cuts between layers only (as llama.cpp's and exo's
//! do): each stage holds whole layers, a mixture-of-experts layer with
//! all its experts.

use std::collections::BTreeMap;

use super::{Graph, NodeId, NodeKind};

/// The metadata key naming the prefix of each layer's nodes.
pub const LAYER_PREFIX_KEY: &str = "tessera.layer_prefix";

impl Graph {
    /// The op nodes of each declared layer (none where the model declares
    /// no layers), by layer number.
    pub fn layers(&self) -> Vec<Vec<NodeId>> {
        let Some(prefix) = self
            .model()
            .metadata_props
            .iter()
            .find(|e| e.key.as_deref() == Some(LAYER_PREFIX_KEY))
            .and_then(|e| e.value.as_deref())
            .filter(|p| !p.is_empty())
        else {
            return Vec::new();
        };
        let mut layers: BTreeMap<u64, Vec<NodeId>> = BTreeMap::new();
        for &id in self.topo_ops() {
            let node = self.node(id);
            if node.kind != NodeKind::Op {
                continue;
            }
            let number = node
                .name
                .strip_prefix(prefix)
                .and_then(|rest| rest.split('/').next())
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(n) = number {
                layers.entry(n).or_default().push(id);
            }
        }
        layers.into_values().collect()
    }
}

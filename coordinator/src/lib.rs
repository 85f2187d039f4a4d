//! Tessera coordinator: gathers QueryNetwork answers from workers, assigns
//! affinities, partitions the model with [`tessera_common::partition`],
//! deploys subgraphs and routes inference requests.
//!
//! Status: an empty shell; the distributed runtime arrives with its own issue.
//! See `docs/architecture.md`.

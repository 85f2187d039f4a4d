//! Tessera worker: hosts device plugins (one per compute backend), answers
//! QueryNetwork, compiles the subgraphs the coordinator ships and runs them.
//!
//! Status: an empty shell. The plugin API, the CPU plugin on tract and the
//! worker daemon arrive with their own issues; see `docs/architecture.md`.

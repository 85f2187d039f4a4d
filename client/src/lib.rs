//! Tessera client SDK: connects to a coordinator, loads networks and runs
//! inference requests.
//!
//! Status: an empty shell; the SDK arrives with the distributed issue.
//! See `docs/architecture.md`.

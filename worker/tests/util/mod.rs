//! Helpers shared by the worker's integration tests.
#![allow(dead_code)]

#[path = "../../../tests/rust/models.rs"]
mod models;
#[path = "../../../tests/rust/oracle.rs"]
mod oracle;
pub use models::model_path;
pub use oracle::{max_abs_diff, onnxruntime};

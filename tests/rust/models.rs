//! The real test models (`scripts/fetch-test-models.sh`), for integration
//! tests of any crate one level below the repository root (included with
//! `#[path]` by their `tests/it/util/mod.rs`).

use std::path::PathBuf;

/// The path of test model `name`: in `$TESSERA_MODELS_DIR`, else
/// `.cache/models/`; panics with how to fetch it when missing.
pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")));
    let p = dir.join(name);
    assert!(
        p.exists(),
        "missing {}: run scripts/fetch-test-models.sh",
        p.display()
    );
    p
}

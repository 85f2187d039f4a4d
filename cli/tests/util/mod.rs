//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A real test model (`scripts/fetch-test-models.sh`).
pub fn model(name: &str) -> PathBuf {
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

/// Runs the `tessera` binary: (success, stdout, stderr).
pub fn tessera(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("tessera runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

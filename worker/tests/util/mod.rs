//! Helpers shared by the worker's integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use tessera_common::tensor::{read_npy, write_npy, Tensor};

#[path = "../../../tests/rust/models.rs"]
mod models;
pub use models::model_path;

/// Outputs of onnxruntime on `inputs` (through `tests/python/ort_run.py`).
pub fn onnxruntime(model: &Path, inputs: &[(String, Tensor)], dir: &Path) -> Vec<Tensor> {
    std::fs::create_dir_all(dir).unwrap();
    let mut args = vec![
        model.to_string_lossy().into_owned(),
        dir.to_string_lossy().into_owned(),
    ];
    for (i, (name, t)) in inputs.iter().enumerate() {
        let file = dir.join(format!("in{i}.npy"));
        std::fs::write(&file, write_npy(t).unwrap()).unwrap();
        args.push(format!("{name}={}", file.display()));
    }
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/python/ort_run.py"
        ))
        .args(&args)
        .output()
        .expect("python3 with onnxruntime (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..)
        .map(|i| dir.join(format!("out{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

/// Largest absolute difference between two float tensors of one shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

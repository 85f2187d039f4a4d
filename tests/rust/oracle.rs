//! The onnxruntime oracle for integration tests of any crate one level
//! below the repository root (included with `#[path]`).

use std::path::Path;
use std::process::Command;

use tessera_common::tensor::{read_npy, write_npy, Tensor};

/// Outputs of onnxruntime for each input set (through
/// `tests/python/ort_run.py`, one session for all of them).
pub fn onnxruntime_many(
    model: &Path,
    runs: &[Vec<(String, Tensor)>],
    dir: &Path,
) -> Vec<Vec<Tensor>> {
    std::fs::create_dir_all(dir).unwrap();
    let mut args = vec![
        model.to_string_lossy().into_owned(),
        dir.to_string_lossy().into_owned(),
    ];
    for (r, inputs) in runs.iter().enumerate() {
        if r > 0 {
            args.push("--".into());
        }
        for (i, (name, t)) in inputs.iter().enumerate() {
            let file = dir.join(format!("in{r}_{i}.npy"));
            std::fs::write(&file, write_npy(t).unwrap()).unwrap();
            args.push(format!("{name}={}", file.display()));
        }
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
    (0..runs.len())
        .map(|r| {
            let prefix = if r == 0 {
                String::new()
            } else {
                format!("run{r}_")
            };
            (0..)
                .map(|i| dir.join(format!("{prefix}out{i}.npy")))
                .take_while(|p| p.exists())
                .map(|p| read_npy(&std::fs::read(p).unwrap()).unwrap())
                .collect()
        })
        .collect()
}

/// Outputs of onnxruntime on `inputs`.
pub fn onnxruntime(model: &Path, inputs: &[(String, Tensor)], dir: &Path) -> Vec<Tensor> {
    onnxruntime_many(model, &[inputs.to_vec()], dir)
        .pop()
        .unwrap_or_default()
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

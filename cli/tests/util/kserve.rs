//! Helpers of the serving tests: free ports, and the Python checks with
//! real clients (`tests/python/*.py`).

use std::path::PathBuf;
use std::process::Command;

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The folder of the fetched test models.
pub fn models_dir() -> PathBuf {
    super::model("magika_standard_v3_3.onnx")
        .parent()
        .expect("models dir")
        .to_path_buf()
}

/// Runs `tests/python/SCRIPT URL MODELS ARGS...`; its output is printed,
/// and a failure fails the test with it.
pub fn python(script: &str, url: &str, args: &[&str]) {
    let path = format!("{}/../tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .arg(url)
        .arg(models_dir())
        .args(args)
        .output()
        .expect("python3 with tritonclient[http,grpc] (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! Helpers shared by the worker's integration tests.
#![allow(dead_code, unused_imports)]

#[path = "../../../../tests/rust/models.rs"]
mod models;
#[path = "../../../../tests/rust/oracle.rs"]
mod oracle;
pub use models::model_path;
pub use oracle::{max_abs_diff, onnxruntime};

/// Where onnx 1.17's node tests are: `$TESSERA_NODE_TESTS`, else those of
/// the onnx package python3 imports (`scripts/test.sh` installs onnx).
pub fn node_test_root() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_NODE_TESTS") {
        return dir.into();
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend/test/data/node'))"])
        .output()
        .expect("python3 with onnx==1.17.0 (scripts/test.sh installs it)");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The GPU plugin, or `None` (after saying why) where this machine has no
/// adapter and the GPU tests are not required (`TESSERA_GPU_TESTS=required`,
/// which `scripts/test.sh` sets after installing lavapipe).
pub fn gpu_plugin() -> Option<tessera_worker::plugins::gpu::GpuPlugin> {
    tessera_worker::crash::install();
    match tessera_worker::plugins::gpu::GpuPlugin::new() {
        Ok(p) => Some(p),
        Err(e) if std::env::var("TESSERA_GPU_TESTS").as_deref() != Ok("required") => {
            println!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// A CPU plugin on `backend` (`tract` or `onnxruntime`) named `name`;
/// onnxruntime comes from the Python package `scripts/test.sh` installs.
pub fn cpu_plugin(
    backend: &str,
    name: &str,
) -> std::sync::Arc<dyn tessera_worker::plugin::DevicePlugin> {
    tessera_worker::crash::install();
    let options = tessera_worker::plugins::PluginOptions {
        cpu_backend: backend.parse().expect("a CPU backend name"),
        onnxruntime_library: None,
        calibration_dir: None,
    };
    tessera_worker::plugins::cpu_plugin(name, &options)
        .unwrap_or_else(|e| panic!("the {backend} CPU plugin: {e}"))
}

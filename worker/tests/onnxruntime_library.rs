//! Loading onnxruntime's library: clear errors for a missing file or a
//! library that is not onnxruntime, a forced backend that cannot start is
//! an error while `auto` falls back to tract, and one library per process.
//! One test, in order, in its own process: the first successful load is
//! kept for the life of the process.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use tessera_worker::plugins::onnxruntime::library;
use tessera_worker::plugins::{cpu_plugin, CpuBackend, PluginOptions};

#[test]
fn missing_or_wrong_libraries_are_clear_errors_and_one_library_is_kept() {
    let missing = Path::new("/nonexistent/libonnxruntime.so.1.32.0");
    let err = library::load(Some(missing)).err().unwrap();
    assert!(
        matches!(&err, library::LoadError::NotFound(tried)
            if tried.iter().any(|t| t.contains("no such file"))),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(
            "onnxruntime 1.32.0 not found: set ORT_DYLIB_PATH or install onnxruntime==1.32.0"
        ),
        "{err}"
    );

    // A shared library that is not onnxruntime.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists());
    if let Some(libm) = libm {
        let err = library::load(Some(libm)).err().unwrap();
        assert!(
            err.to_string().contains("does not export OrtGetApiBase"),
            "{err}"
        );
    }

    // Forced onnxruntime with a bad path: an error naming it; auto with
    // no explicit path falls back only when nothing loads.
    let forced = PluginOptions {
        cpu_backend: CpuBackend::OnnxRuntime,
        onnxruntime_library: Some(missing.to_path_buf()),
        calibration_dir: None,
    };
    let err = cpu_plugin("CPU", &forced).err().unwrap().to_string();
    assert!(err.contains("onnxruntime 1.32.0 not found"), "{err}");
    let auto_with_path = PluginOptions {
        cpu_backend: CpuBackend::Auto,
        onnxruntime_library: Some(missing.to_path_buf()),
        calibration_dir: None,
    };
    assert!(cpu_plugin("CPU", &auto_with_path).is_err());

    // The real library (the Python package's), then no other one.
    let runtime = library::load(None).expect("onnxruntime==1.32.0 (scripts/test.sh installs it)");
    assert_eq!(runtime.version, library::VERSION);
    let cpu = cpu_plugin("CPU", &PluginOptions::default()).unwrap();
    assert!(cpu
        .metric("FULL_DEVICE_NAME")
        .unwrap()
        .to_string()
        .contains("onnxruntime 1.32.0"));
    let err = library::load(Some(missing)).err().unwrap();
    assert!(
        matches!(err, library::LoadError::AlreadyLoaded { .. }),
        "{err}"
    );
    assert_eq!(
        library::load(Some(&runtime.path)).unwrap().path,
        runtime.path
    );
}

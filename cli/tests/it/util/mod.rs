//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub mod cluster;
pub mod genai;
pub mod ha;
pub mod kserve;
pub mod llama_cpp;
#[path = "../../../../tests/rust/models.rs"]
mod models;
pub mod netns;
#[path = "../../../../tests/rust/oracle.rs"]
pub mod oracle;

/// A real test model (`scripts/fetch-test-models.sh`).
pub fn model(name: &str) -> PathBuf {
    models::model_path(name)
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

/// A two-thread tokio runtime for driving the client SDK in tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tessera_worker::crash::install();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A figure of process `pid`'s `/proc/PID/status` (`VmRSS:`, `VmHWM:`,
/// `VmSize:`), in bytes.
pub fn status_bytes(pid: u32, key: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// A test's scratch folder (`tessera-NAME-PID` in the temporary
/// directory, made empty), removed when dropped unless the test failed.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tessera-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch folder in the temporary directory");
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

//! Finding and loading onnxruntime's shared library at run time.
//!
//! The library is `libonnxruntime.so.1.32.0` from the PyPI wheel
//! `onnxruntime==1.32.0` (`onnxruntime/capi/`; it needs only libc and
//! libstdc++). It is looked for, in order: the path the worker is given
//! (`onnxruntime_library` in worker.toml, `--onnxruntime-library`),
//! `ORT_DYLIB_PATH`, the installed Python package (asked once), then next to
//! the executable (where the container image puts it). Its version is read
//! from the library itself before `ort` loads it: `ort` keeps the first
//! library it loads for the life of the process, and its lazy loader panics
//! on failure, so it is only ever handed a checked path.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use ort::environment::Environment;

/// The onnxruntime release this build is written and tested against.
pub const VERSION: &str = "1.32.0";
/// The library's file name in the wheel.
pub const FILE_NAME: &str = "libonnxruntime.so.1.32.0";

/// The loaded library: where it came from, its version and the process's
/// onnxruntime environment (sessions are built in it).
pub struct Runtime {
    pub path: PathBuf,
    pub version: String,
    pub env: Environment,
}

/// What was loaded (or why nothing could be), once per process.
static LOADED: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// The message for a missing or unusable library.
/// Why onnxruntime cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No candidate is a usable library of this version: what each was.
    #[error("onnxruntime {VERSION} not found: set ORT_DYLIB_PATH or install onnxruntime=={VERSION} ({})", .0.join("; "))]
    NotFound(Vec<String>),
    #[error("onnxruntime is already loaded from {} in this process; cannot also load {}", loaded.display(), wanted.display())]
    AlreadyLoaded { loaded: PathBuf, wanted: PathBuf },
    #[error("onnxruntime at {} failed to start: {reason}", path.display())]
    Start { path: PathBuf, reason: String },
    #[error("onnxruntime loader poisoned")]
    Poisoned,
}

/// Candidate paths, in order, each with where it came from.
fn candidates(explicit: Option<&Path>) -> Vec<(PathBuf, &'static str)> {
    let mut out = Vec::new();
    if let Some(p) = explicit {
        out.push((p.to_path_buf(), "the worker's onnxruntime_library"));
        // An explicit path is the only one tried.
        return out;
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        out.push((PathBuf::from(p), "ORT_DYLIB_PATH"));
        return out;
    }
    if let Some(p) = from_python() {
        out.push((p, "the onnxruntime Python package"));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        out.push((dir.join(FILE_NAME), "next to the executable"));
    }
    out
}

/// `onnxruntime/capi/libonnxruntime.so.*` of the installed Python package,
/// found without importing it (importing takes a second).
fn from_python() -> Option<PathBuf> {
    let script = "import importlib.util as u, os\n\
                  s = u.find_spec('onnxruntime')\n\
                  print(os.path.join(s.submodule_search_locations[0], 'capi') if s else '')";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    if dir.as_os_str().is_empty() {
        return None;
    }
    let exact = dir.join(FILE_NAME);
    if exact.exists() {
        return Some(exact);
    }
    // Another release: report its version rather than "not found".
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        })
        .collect();
    found.sort();
    found.pop()
}

/// The version string the library reports (`OrtGetApiBase()->GetVersionString()`).
fn library_version(path: &Path) -> Result<String, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen/dlsym/dlerror are called with valid NUL-terminated
    // strings; the symbol is only called if present, with the signature the
    // onnxruntime C API gives it, and its result is checked for null. The
    // handle stays open (ort opens the same library again if it is used).
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let why = libc::dlerror();
            return Err(if why.is_null() {
                "cannot be loaded".into()
            } else {
                CStr::from_ptr(why).to_string_lossy().into_owned()
            });
        }
        let symbol = libc::dlsym(handle, c"OrtGetApiBase".as_ptr());
        if symbol.is_null() {
            return Err("does not export OrtGetApiBase: not an onnxruntime library".into());
        }
        let get_base: unsafe extern "C" fn() -> *const ort::sys::OrtApiBase =
            std::mem::transmute(symbol);
        let base = get_base();
        if base.is_null() {
            return Err("OrtGetApiBase returned nothing".into());
        }
        let version = ((*base).GetVersionString)();
        if version.is_null() {
            return Err("reports no version".into());
        }
        Ok(CStr::from_ptr(version).to_string_lossy().into_owned())
    }
}

/// Loads onnxruntime (once per process) from `explicit` or the usual
/// places; a library of another version is refused.
pub fn load(explicit: Option<&Path>) -> Result<Arc<Runtime>, LoadError> {
    let mut loaded = LOADED.lock().map_err(|_| LoadError::Poisoned)?;
    if let Some(rt) = loaded.as_ref() {
        return match explicit {
            Some(p) if p != rt.path => Err(LoadError::AlreadyLoaded {
                loaded: rt.path.clone(),
                wanted: p.to_path_buf(),
            }),
            _ => Ok(rt.clone()),
        };
    }
    let candidates = candidates(explicit);
    if candidates.is_empty() {
        return Err(LoadError::NotFound(vec![
            "no library path given and no Python package found".into(),
        ]));
    }
    let mut tried = Vec::new();
    for (path, origin) in candidates {
        if !path.exists() {
            tried.push(format!("{} (from {origin}): no such file", path.display()));
            continue;
        }
        match library_version(&path) {
            Ok(v) if v == VERSION => {
                let rt = init(&path, v)?;
                tracing::info!(path = %rt.path.display(), version = %rt.version, "onnxruntime loaded");
                let rt = Arc::new(rt);
                *loaded = Some(rt.clone());
                return Ok(rt);
            }
            Ok(v) => tried.push(format!(
                "{} (from {origin}) is onnxruntime {v}",
                path.display()
            )),
            Err(e) => tried.push(format!("{} (from {origin}): {e}", path.display())),
        }
    }
    Err(LoadError::NotFound(tried))
}

fn init(path: &Path, version: String) -> Result<Runtime, LoadError> {
    let failed = |e: &dyn std::fmt::Display| LoadError::Start {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let env = ort::init_from(path)
        .map_err(|e| failed(&e))?
        .with_name("tessera")
        .with_telemetry(false)
        .build()
        .map_err(|e| failed(&e))?;
    Ok(Runtime {
        path: path.to_path_buf(),
        version,
        env,
    })
}

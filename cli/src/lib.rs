//! Shared by Tessera's binaries (`tessera`, `coordinator`, `worker`):
//! logging set-up, the allocator's tuning ([`tune_allocator`]), start-up
//! announcements, the embedded local cluster ([`cluster`]) and front doors
//! ([`front_door`]).

pub mod cluster;
pub mod daemons;
pub mod front_door;

/// `TESSERA_*` variables every binary reads for itself (not configuration
/// keys): gdb on a crash, the GPU plugin's wgpu backend, shared memory
/// with peers on the same host (`off`).
pub const PROCESS_ENV: [&str; 3] = [
    "TESSERA_CRASH_GDB",
    "TESSERA_GPU_BACKEND",
    "TESSERA_SHARED_MEMORY",
];

/// A model read by path ([`read_model`]).
pub struct ModelRead {
    pub bytes: bytes::Bytes,
    /// What a generative model's files say of generation.
    pub generation: Option<tessera_common::wire::generate::GenerationSpec>,
    /// The bytes' SHA-256 (hex), remembered by the files they were read
    /// from while those are unchanged: a client names a large model by it
    /// and sends it only to a coordinator without those bytes. `None` for
    /// an ONNX file under [`tessera_client::KNOWN_ABOVE`] (sent
    /// as it is) or sources that cannot be named.
    pub sha256: Option<String>,
}

/// A model by path: an ONNX file's bytes as they are, or a generative
/// model (a GGUF file, built or taken from the build cache, or a model
/// folder) encoded, with what its files say of generation; each copy of a
/// generative model keeps state for `max_sequences` sequences.
pub fn read_model(path: &std::path::Path, max_sequences: u32) -> anyhow::Result<ModelRead> {
    use anyhow::Context as _;
    if tessera_gguf::generative::is_generative(path) {
        let read = tessera_gguf::generative::read(path, max_sequences)
            .with_context(|| format!("reading {}", path.display()))?;
        return Ok(ModelRead {
            bytes: read.model,
            generation: Some(read.spec),
            sha256: read.model_sha256,
        });
    }
    let bytes: bytes::Bytes = std::fs::read(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .into();
    // An ONNX file of 515 MiB takes 0.4 s to hash: once per version of it.
    let sha256 = (bytes.len() >= tessera_client::KNOWN_ABOVE)
        .then(|| {
            let identity =
                tessera_gguf::cache::file_identity(path).map(|f| format!("onnx file\n{f}"));
            tessera_gguf::cache::remembered_sha256_of(identity, &bytes)
        })
        .flatten();
    Ok(ModelRead {
        bytes,
        generation: None,
        sha256,
    })
}

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`); colours only
/// on a terminal.
pub fn init_tracing() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Keeps freed memory in the process for the next request instead of
/// returning it to the kernel at once (glibc only; elsewhere a no-op).
///
/// Every tensor that crosses a link is reassembled into a fresh buffer and
/// QUIC allocates one per datagram, so a busy node frees and allocates
/// megabytes per request. glibc's default trims the top of its heaps as
/// soon as 128 KB there are free, and the next allocation faults the same
/// pages in again, zeroed: a quarter of a QUIC link's CPU went to page
/// faults. With heaps trimmed only past 64 MiB free and allocations up to
/// 4 MiB served from them, a link moved 1 MB tensors at 2.9–3.2 GB/s
/// instead of 1.7–2.7 (measured: `cargo bench -p tessera-cli --bench
/// cluster -- quic`).
///
/// Larger allocations stay mapped on their own and go back to the kernel
/// when freed: weights. Building an onnxruntime session copies each weight
/// and frees the copy; served from the heaps (as they were with a 32 MiB
/// bound), those copies stayed in the process, and a session of a 256 MiB
/// model grew it by 515 MiB instead of 256 (the onnxruntime plugin, one
/// thread; 272 MiB at the peak). Call first thing in `main`, before
/// threads start.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; called before
        // other threads allocate.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
    }
}

/// Keeps Mesa's Vulkan device-selection layer out of GPU start-up, unless
/// the user set `NODEVICE_SELECT` themselves.
///
/// The layer (an implicit layer that Mesa's drivers install, lavapipe's
/// included) picks a default adapter for a desktop session by connecting
/// to its Wayland display; on a server without one, libwayland prints
/// `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`,
/// four times per run, though nothing failed. Tessera picks its adapter
/// itself (`GPU.N`), so the layer has nothing to do here; the loader's
/// own errors (no driver, no device) still show. Call first thing in
/// `main`, before threads start: it sets an environment variable.
pub fn quiet_vulkan_device_select() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

/// Completes on SIGTERM (`docker compose stop`, systemd) or Ctrl-C.
pub async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
                }
                return;
            }
            Err(e) => tracing::warn!("cannot watch for SIGTERM: {e}"),
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The coordinators of `--coordinator a:7400,b:7400` (one, or every
/// coordinator of an HA cluster), resolved.
pub async fn resolve_coordinators(list: &str) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    let mut addrs = Vec::new();
    for item in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let addr = tessera_net::resolve(item)
            .await
            .map_err(|e| anyhow::anyhow!("coordinator '{item}': {e}"))?;
        addrs.push(addr);
    }
    if addrs.is_empty() {
        anyhow::bail!("no coordinator address in '{list}'");
    }
    Ok(addrs)
}

/// One line on stdout, flushed at once (scripts and tests wait for it).
pub fn announce(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// The exit status for a command's result; an error is printed as one
/// `error: ...` line with its causes (see [`error_line`]).
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `: `-separated as anyhow's `{:#}`
/// writes them, less each cause whose message the one before it already
/// holds (the libraries' errors name their cause in their own message and
/// keep it as their source too).
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let message = cause.to_string();
        if previous.is_empty() || !previous.contains(&message) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&message);
        }
        previous = message;
    }
    line
}

/// `--shape NAME=d0,d1,...` values (concrete shapes of graph inputs) as a
/// map; a name given twice or a dim that is not a number is an error.
pub fn parse_shapes(
    specs: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<usize>>> {
    use anyhow::Context as _;
    let mut shapes = std::collections::BTreeMap::new();
    for spec in specs {
        let (name, dims) = spec
            .split_once('=')
            .with_context(|| format!("--shape {spec}: expected NAME=d0,d1,..."))?;
        let dims = dims
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .map(|d| d.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("--shape {spec}: dims must be non-negative integers"))?;
        if shapes.insert(name.to_string(), dims).is_some() {
            anyhow::bail!("--shape given twice for '{name}'");
        }
    }
    Ok(shapes)
}

#[cfg(test)]
mod tests {
    use super::error_line;

    #[test]
    fn a_large_onnx_file_is_named_by_its_hash_and_a_changed_one_again() {
        let dir = std::env::temp_dir().join(format!("tessera-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.onnx");
        let sha = |bytes: &[u8]| tessera_common::wire::pieces::sha256_hex(bytes);
        let small = vec![7u8; 1000];
        std::fs::write(&path, &small).unwrap();
        let read = super::read_model(&path, 1).unwrap();
        assert_eq!(read.bytes.as_ref(), &small[..]);
        assert!(read.sha256.is_none(), "a small model is sent as it is");
        let mut large = vec![1u8; tessera_client::KNOWN_ABOVE];
        std::fs::write(&path, &large).unwrap();
        let first = super::read_model(&path, 1).unwrap().sha256;
        assert_eq!(first, Some(sha(&large)));
        // Read again: the same hash (remembered by the file's identity).
        assert_eq!(super::read_model(&path, 1).unwrap().sha256, first);
        // The file changes (its size, time and inode): hashed afresh.
        large.push(2);
        let next = dir.join("next.onnx");
        std::fs::write(&next, &large).unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(
            super::read_model(&path, 1).unwrap().sha256,
            Some(sha(&large))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A library error that names its cause and keeps it as its source.
    #[derive(Debug)]
    struct Read(std::io::Error);

    impl std::fmt::Display for Read {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot read model.onnx: {}", self.0)
        }
    }

    impl std::error::Error for Read {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        let io = std::io::Error::other("no such file");
        let e = anyhow::Error::new(Read(io)).context("loading the model");
        assert_eq!(
            error_line(&e),
            "loading the model: cannot read model.onnx: no such file"
        );
        let plain = anyhow::anyhow!("outer").context("context");
        assert_eq!(error_line(&plain), "context: outer");
    }
}

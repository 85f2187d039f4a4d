//! Shared by Tessera's binaries (`tessera`, `coordinator`, `worker`):
//! logging set-up, start-up announcements, and the embedded local cluster
//! ([`cluster`]).

pub mod cluster;

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

/// One line on stdout, flushed at once (scripts and tests wait for it).
pub fn announce(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// The exit status for a command's result; an error is printed as one
/// `error: ...` line with its causes.
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

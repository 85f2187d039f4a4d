//! `worker`: Tessera's worker (see [`tessera_cli::daemons::worker`]). The
//! `tessera` binary is the same program when called `worker` (the
//! container image ships one binary and links).

fn main() -> std::process::ExitCode {
    tessera_cli::daemons::worker::main()
}

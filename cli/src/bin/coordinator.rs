//! `coordinator`: Tessera's coordinator (see [`tessera_cli::daemons::coordinator`]). The
//! `tessera` binary is the same program when called `coordinator` (the
//! container image ships one binary and links).

fn main() -> std::process::ExitCode {
    tessera_cli::daemons::coordinator::main()
}

//! The `coordinator` and `worker` programs. Each is its own binary, and the
//! `tessera` binary runs either when called by its name (a link named
//! `coordinator` or `worker`, as the container image ships them: one
//! binary instead of three copies of the same code).

pub mod coordinator;
pub mod worker;

/// A program the `tessera` binary also is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Coordinator,
    Worker,
}

impl Program {
    /// The program `argv0` (the path a process was started by) names, if
    /// it is one of these.
    pub fn called(argv0: &std::ffi::OsStr) -> Option<Program> {
        match std::path::Path::new(argv0).file_name()?.to_str()? {
            "coordinator" => Some(Program::Coordinator),
            "worker" => Some(Program::Worker),
            _ => None,
        }
    }

    /// Runs it: parses its arguments, serves, and says how it ended.
    pub fn run(self) -> std::process::ExitCode {
        match self {
            Program::Coordinator => coordinator::main(),
            Program::Worker => worker::main(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_named_after_a_program_runs_it() {
        for (argv0, program) in [
            ("/usr/local/bin/coordinator", Some(Program::Coordinator)),
            ("worker", Some(Program::Worker)),
            ("/usr/local/bin/tessera", None),
            ("workers", None),
            ("", None),
        ] {
            assert_eq!(Program::called(argv0.as_ref()), program, "{argv0}");
        }
    }
}

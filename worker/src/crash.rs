//! Crash reports: a process that dies of a fatal signal (SIGSEGV, SIGBUS,
//! SIGILL, SIGFPE, SIGABRT) first writes every thread's backtrace to
//! stderr, so that a rare crash in a test run or a worker says where it
//! happened.
//!
//! The handler does only what is safe inside a signal handler: it writes
//! a line with `write(2)`, starts `gdb -p PID` (found on `PATH` when the
//! handler was installed; its arguments are prepared then too) with a raw
//! `clone` system call (no fork handlers, which could wait for a lock the
//! crashing thread holds), lets it print `thread apply all bt` of this
//! process, waits for it, then puts back the action that was there before
//! and lets the signal take its course (Rust's own stack-overflow report,
//! or the default: death by that signal, with its exit status). Without
//! gdb it prints the crashing thread's backtrace through
//! `std::backtrace` instead (best effort: that allocates).
//!
//! `TESSERA_CRASH_GDB=0` turns gdb off (the fallback still prints).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The signals reported, with their names.
const SIGNALS: [(c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGABRT, "SIGABRT"),
];

/// How long gdb may take (attaching to a large test binary reads its
/// symbols), seconds, where `timeout` is on `PATH`.
const GDB_SECONDS: &str = "120";

/// What the handler needs, made before any signal can come.
struct Prepared {
    /// The program to run and its argument vector (null-terminated), or
    /// none without gdb.
    program: Option<CString>,
    _args: Vec<CString>,
    argv: Vec<*const c_char>,
    /// The action of each of [`SIGNALS`] before ours.
    previous: Vec<libc::sigaction>,
}

// SAFETY: the pointers point into `_args`, which lives as long as the
// `Prepared` (a static) and is never changed after it is made.
unsafe impl Send for Prepared {}
unsafe impl Sync for Prepared {}

static PREPARED: OnceLock<Prepared> = OnceLock::new();
/// Set by the first thread that reports; another thread that crashes
/// meanwhile waits for the process to end.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Installs the crash report for this process (once; later calls do
/// nothing). Call it early in `main`, after the Rust runtime set up its
/// own stack-overflow handler (which the report then hands on to).
pub fn install() {
    PREPARED.get_or_init(|| {
        let (program, args) = gdb_command().unzip();
        let args = args.unwrap_or_default();
        let mut argv: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let previous = SIGNALS.iter().map(|&(sig, _)| set_handler(sig)).collect();
        Prepared {
            program,
            _args: args,
            argv,
            previous,
        }
    });
}

/// `[timeout 120] gdb -p PID -batch ...`, or none when gdb is off or
/// not on `PATH`.
fn gdb_command() -> Option<(CString, Vec<CString>)> {
    if std::env::var("TESSERA_CRASH_GDB").as_deref() == Ok("0") {
        return None;
    }
    let gdb = on_path("gdb")?;
    let pid = std::process::id().to_string();
    let mut words: Vec<String> = Vec::new();
    let program = match on_path("timeout") {
        Some(timeout) => {
            words.extend([timeout.clone(), GDB_SECONDS.into(), gdb]);
            timeout
        }
        None => {
            words.push(gdb.clone());
            gdb
        }
    };
    words.extend(
        [
            "-nx",
            "-batch",
            "-p",
            &pid,
            "-ex",
            "set print frame-arguments none",
            "-ex",
            "info threads",
            "-ex",
            "thread apply all bt 40",
        ]
        .map(String::from),
    );
    let args = words
        .into_iter()
        .map(CString::new)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    Some((CString::new(program).ok()?, args))
}

/// The first executable `name` on `PATH`.
fn on_path(name: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|p| p.into_os_string().into_string().ok())
}

/// Puts [`on_fatal`] on `sig` (on the thread's alternate stack where it
/// has one); returns the action it replaces.
fn set_handler(sig: c_int) -> libc::sigaction {
    // SAFETY: plain sigaction calls with zeroed, then filled, structures.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_fatal as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &action, &mut previous);
        previous
    }
}

/// Writes `bytes` to stderr (async-signal-safe).
fn say(bytes: &[u8]) {
    // SAFETY: write(2) on a valid buffer.
    unsafe {
        libc::write(2, bytes.as_ptr().cast::<c_void>(), bytes.len());
    }
}

/// Writes `n` in decimal to stderr without allocating.
fn say_number(mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    say(&digits[at..]);
}

extern "C" fn on_fatal(sig: c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    if REPORTING.swap(true, Ordering::SeqCst) {
        // Another thread is reporting; the process ends when it is done.
        loop {
            // SAFETY: pause(2) only waits.
            unsafe { libc::pause() };
        }
    }
    let Some(prepared) = PREPARED.get() else {
        return;
    };
    let index = SIGNALS.iter().position(|&(s, _)| s == sig).unwrap_or(0);
    say(b"\n=== tessera: fatal signal ");
    say(SIGNALS[index].1.as_bytes());
    say(b" in thread ");
    // SAFETY: gettid(2) and getpid(2) cannot fail.
    say_number(unsafe { libc::syscall(libc::SYS_gettid) } as u64);
    say(b" of process ");
    say_number(u64::from(std::process::id()));
    say(b"; every thread's backtrace follows ===\n");
    match &prepared.program {
        Some(program) => run_gdb(program, &prepared.argv),
        None => {
            // Not async-signal-safe (it allocates): the last resort.
            let trace = std::backtrace::Backtrace::force_capture();
            say(format!("{trace}\n").as_bytes());
        }
    }
    say(b"=== tessera: end of the crash report ===\n");
    // SAFETY: puts back the action `install` found, then lets the signal
    // act: a fault re-runs the faulting instruction, a signal someone
    // sent (si_code <= 0) is raised again.
    unsafe {
        libc::sigaction(sig, &prepared.previous[index], std::ptr::null_mut());
        if info.is_null() || (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

/// Starts gdb on this process and waits for it (async-signal-safe: a raw
/// clone, then only dup2, execv and _exit in the child).
fn run_gdb(program: &CString, argv: &[*const c_char]) {
    // SAFETY: clone with SIGCHLD only is fork(2) without glibc's fork
    // handlers; the child only calls async-signal-safe functions.
    unsafe {
        let child = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0);
        if child == 0 {
            libc::dup2(2, 1);
            libc::execv(program.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
        if child < 0 {
            say(b"(cannot start gdb)\n");
            return;
        }
        let child = child as libc::pid_t;
        // Where Yama restricts ptrace to ancestors, allow this child.
        libc::prctl(libc::PR_SET_PTRACER, child as libc::c_ulong, 0, 0, 0);
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
}

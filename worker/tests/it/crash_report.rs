//! The crash report: a test process that dies of SIGSEGV prints every
//! thread's backtrace (gdb, which `scripts/test.sh` installs) before it
//! dies, naming the function that faulted.
//!
//! `planted_segfault` faults on purpose, and only where
//! `TESSERA_PLANT_SEGFAULT=1`; `crash_report_names_the_fault` runs it in
//! a child process of this same test binary and reads what it printed.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const PLANT: &str = "TESSERA_PLANT_SEGFAULT";

#[inline(never)]
fn planted_fault_in_tessera_test() {
    let address = std::hint::black_box(16usize) as *mut u64;
    // SAFETY: not safe at all: this writes to an unmapped page on purpose,
    // in a child process that exists to crash.
    unsafe { address.write_volatile(1) };
}

#[test]
fn planted_segfault() {
    if std::env::var(PLANT).as_deref() != Ok("1") {
        return;
    }
    tessera_worker::crash::install();
    planted_fault_in_tessera_test();
}

#[test]
fn crash_report_names_the_fault() {
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["crash_report::planted_segfault", "--exact", "--nocapture"])
        .env(PLANT, "1")
        .output()
        .expect("the test binary runs again");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the planted fault kills the child with SIGSEGV: {:?}",
        out.status
    );
    assert!(
        stderr.contains("fatal signal SIGSEGV"),
        "the report's first line: {stderr}"
    );
    assert!(
        stderr.contains("planted_fault_in_tessera_test"),
        "the backtrace names the faulting function: {stderr}"
    );
    assert!(stderr.contains("end of the crash report"), "{stderr}");
}

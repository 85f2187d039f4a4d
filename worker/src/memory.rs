//! The machine's memory as Linux reports it (`/proc`): what is available,
//! and what this process holds. Read by the plugins (a CPU device's, or
//! a software GPU's, memory) and by the daemon (heartbeats).

/// Linux's `/proc` figure `key` (in kB) from `file`, in bytes.
fn proc_kb(file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(file)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The machine's available memory (Linux's `MemAvailable`), bytes.
pub fn available_memory() -> Option<u64> {
    proc_kb("/proc/meminfo", "MemAvailable:")
}

/// This process's resident memory (`VmRSS`), bytes; 0 where unknown.
pub fn resident_bytes() -> u64 {
    proc_kb("/proc/self/status", "VmRSS:").unwrap_or(0)
}

//! Read-only maps of Tessera's own files (the build cache's models) whose
//! pages a process gives back once it has read them.
//!
//! A coordinator reads a cached model's weights twice per load, to hash
//! them and to send them, and holds the model between loads for a re-plan.
//! Every page it read stays resident: a 100 MB model kept the
//! coordinator's memory 100 MB above what it needs between loads, and its
//! peak as high. [`release`] drops a range's pages from this process (the
//! kernel's page cache keeps them, so a later read is a minor fault, not
//! a disk read).

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// A map registered for [`release`].
struct Owner(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Every live map made by [`map`].
static MAPS: Mutex<Vec<Weak<memmap2::Mmap>>> = Mutex::new(Vec::new());

/// `file` mapped read-only, its pages [`release`]-able. The caller keeps
/// the file unchanged while mapped (the cache writes its files once under
/// a temporary name and never changes them in place).
pub fn map(file: &std::fs::File) -> std::io::Result<Bytes> {
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: read-only and private; see above for the file's contents.
    let map = Arc::new(unsafe { memmap2::Mmap::map(file)? });
    if let Ok(mut maps) = MAPS.lock() {
        maps.retain(|m| m.strong_count() > 0);
        maps.push(Arc::downgrade(&map));
    }
    Ok(Bytes::from_owner(Owner(map)))
}

/// Gives back the pages wholly inside `bytes`, when they are part of a
/// live map made by [`map`] (anything else, heap bytes say, is left as it
/// is). The bytes stay readable: a later read maps the page again.
pub fn release(bytes: &[u8]) {
    let Ok(maps) = MAPS.lock() else {
        return;
    };
    let start = bytes.as_ptr() as usize;
    let end = start + bytes.len();
    for map in maps.iter().filter_map(Weak::upgrade) {
        let base = map.as_ptr() as usize;
        if start < base || end > base + map.len() {
            continue;
        }
        let page = page_size();
        let from = (start - base).next_multiple_of(page);
        let to = (end - base) / page * page;
        if to > from {
            // SAFETY: the range lies in a private read-only file map that
            // `map` keeps alive for this call; dropping its pages only
            // makes a later access read them from the file again.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
            };
        }
        return;
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's resident KiB of the map holding `bytes` (its
    /// entry in /proc/self/smaps).
    fn resident_kib(bytes: &[u8]) -> u64 {
        let at = bytes.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((from, to)) = range {
                if let (Ok(from), Ok(to)) = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                ) {
                    inside = (from..to).contains(&at);
                    continue;
                }
            }
            if let (true, Some(kib)) = (inside, line.strip_prefix("Rss:")) {
                return kib.trim().trim_end_matches(" kB").parse().unwrap();
            }
        }
        panic!("no map holds the bytes")
    }

    #[test]
    fn released_pages_leave_and_the_bytes_read_the_same() {
        let path = std::env::temp_dir().join(format!("tessera-pages-{}", std::process::id()));
        let content: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let bytes = map(&std::fs::File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(bytes[..], content[..]);
        assert_eq!(resident_kib(&bytes), 1024);
        release(&bytes[100..]);
        // The first page holds bytes outside the range: it stays.
        assert_eq!(resident_kib(&bytes), page_size() as u64 / 1024);
        assert_eq!(bytes[..], content[..]);
        assert_eq!(resident_kib(&bytes), 1024);
        // Bytes that are no map of ours are left alone.
        let heap = content.clone();
        release(&heap);
        assert_eq!(heap, content);
    }
}

//! Payloads through shared memory between peers on the same host.
//!
//! QUIC spends CPU on every byte: AES-GCM both ways, datagrams built and
//! acknowledged, copies in and out of the kernel. Between two processes on
//! one machine a 1 MB tensor took 516 µs that way against 238 µs over
//! plain TCP; through a shared region it is two copies. So on a loopback
//! connection each side creates a region (a file of its own in `/dev/shm`,
//! mode 0600, [`REGION_BYTES`] of data), names it in its hello, and the
//! peer maps it and removes its name. Payloads of at least [`MIN_SHARED`]
//! bytes are then written there and the stream carries only where they lie
//! (`tessera_common::wire::shared`); smaller ones, ones that do not fit
//! while the region is busy, and every payload before the peer has mapped
//! the region, go on the stream as before. The handshake (mutual TLS)
//! decides who may attach; the bytes never leave the host.
//!
//! `TESSERA_SHARED_MEMORY=off` (or `Node::without_shared_memory`) keeps
//! everything on QUIC. A region the peer does not map (it runs in another mount
//! namespace, a container with its own `/dev/shm`) is removed again and the
//! connection uses QUIC alone.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use bytes::Bytes;
use tessera_common::wire::shared::{SharedAllocator, SharedPayloads, SharedSlice};
use tessera_common::wire::WireError;

/// Each region's data bytes. The file is sparse: its memory (tmpfs pages)
/// is reserved as the allocator first reaches it, which is only as far as
/// the most bytes ever in flight at once (see `SharedAllocator`), and
/// given back when both sides have unmapped it.
pub const REGION_BYTES: u64 = 64 << 20;
/// Memory is reserved for the region in steps of this.
const RESERVE_STEP: u64 = 1 << 20;
/// Slices in flight at once in one region.
const SLOTS: u32 = 512;
/// Payloads below this go on the stream: their copy through QUIC costs
/// less than the frame's round of bookkeeping.
pub const MIN_SHARED: usize = 64 << 10;
/// Where regions are made, and their names' start.
const DIR: &str = "/dev/shm";
const PREFIX: &str = "tessera-";
const MAGIC: [u8; 8] = *b"TSSHM\0\0\x01";
/// The header: magic, data bytes (u64), slots (u32), attached (u32), then
/// one release word per slot from [`WORDS_AT`]; the data from
/// [`data_offset`].
const WORDS_AT: usize = 64;

/// Whether nodes use shared memory with same-host peers unless told
/// otherwise: yes, but for `TESSERA_SHARED_MEMORY=off`.
pub fn enabled() -> bool {
    !std::env::var("TESSERA_SHARED_MEMORY").is_ok_and(|v| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "off" | "0" | "false" | "no"
        )
    })
}

fn data_offset(slots: u32) -> usize {
    (WORDS_AT + 8 * slots as usize).next_multiple_of(4096)
}

/// A shared mapping of a region's file.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with one peer; every access
// to it goes through atomics (header words) or through byte copies of
// ranges that the allocator hands to one writer at a time.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(file: &File, len: usize) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        // SAFETY: a new shared read-write mapping of `len` bytes of an open
        // file; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The atomic `u64` at `at` (8-aligned, inside the header).
    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at + 8 <= self.len);
        // SAFETY: `at` is 8-aligned and in bounds (callers index the header
        // only); the mapping is page-aligned and lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(at).cast()) }
    }

    fn attached(&self) -> &AtomicU32 {
        // SAFETY: offset 20 is 4-aligned and inside the 64-byte header.
        unsafe { AtomicU32::from_ptr(self.ptr.add(20).cast()) }
    }

    fn header(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        // SAFETY: the header's first 24 bytes are inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), 24) };
        out
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; nothing borrows it now.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The region this side writes its payloads into.
pub struct Outgoing {
    map: Mapping,
    file: File,
    path: PathBuf,
    /// The allocator, and how many data bytes have memory reserved.
    allocator: Mutex<(SharedAllocator, u64)>,
    /// Payload bytes written into the region so far.
    placed: AtomicU64,
}

impl Outgoing {
    /// Creates a region named after this process and a random suffix.
    pub fn create() -> std::io::Result<Outgoing> {
        let mut random = [0u8; 12];
        aws_lc_rs::rand::fill(&mut random).map_err(|_| std::io::Error::other("no randomness"))?;
        let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let path = Path::new(DIR).join(format!("{PREFIX}{}-{suffix}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let len = data_offset(SLOTS) + REGION_BYTES as usize;
        // The header's memory now (the peer writes release words there).
        let mapped = file
            .set_len(len as u64)
            .and_then(|()| reserve(&file, 0, data_offset(SLOTS) as u64))
            .and_then(|()| Mapping::map(&file, len));
        let map = match mapped {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let mut header = [0u8; 24];
        header[..8].copy_from_slice(&MAGIC);
        header[8..16].copy_from_slice(&REGION_BYTES.to_le_bytes());
        header[16..20].copy_from_slice(&SLOTS.to_le_bytes());
        // SAFETY: the header's first 24 bytes, inside the fresh mapping
        // that no one else has yet.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), map.ptr, 24) };
        Ok(Outgoing {
            map,
            file,
            path,
            allocator: Mutex::new((SharedAllocator::new(REGION_BYTES, SLOTS), 0)),
            placed: AtomicU64::new(0),
        })
    }

    /// The region's name, for the hello.
    pub fn name(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Whether the peer has mapped the region.
    pub fn attached(&self) -> bool {
        self.map.attached().load(Ordering::Acquire) != 0
    }

    /// Writes `payload` into the region and says where, or `None`: it goes
    /// on the stream (small, the peer has not attached, no room now).
    pub fn place(&self, payload: &[u8]) -> Option<SharedSlice> {
        if payload.len() < MIN_SHARED || !self.attached() {
            return None;
        }
        let released = |slot: u32| {
            self.map
                .word(WORDS_AT + 8 * slot as usize)
                .load(Ordering::Acquire)
        };
        let slice = {
            let mut guard = self.allocator.lock().unwrap_or_else(|p| p.into_inner());
            let (allocator, reserved) = &mut *guard;
            let slice = allocator.allocate(payload.len() as u64, released)?;
            let end = slice.offset + slice.len;
            if end > *reserved {
                // Memory for the bytes before they are written: on a full
                // tmpfs a write to an unreserved page would be a SIGBUS.
                let upto = end.next_multiple_of(RESERVE_STEP).min(REGION_BYTES);
                let at = data_offset(SLOTS) as u64;
                if let Err(e) = reserve(&self.file, at + *reserved, upto - *reserved) {
                    tracing::debug!("shared memory full ({e}): the payload goes on QUIC");
                    allocator.cancel(&slice);
                    return None;
                }
                *reserved = upto;
            }
            slice
        };
        debug_assert!(slice.offset + slice.len <= REGION_BYTES && slice.slot < SLOTS);
        // SAFETY: the allocator gave this range to this call alone (inside
        // the data area, not overlapping any slice in flight).
        unsafe {
            let at = self.map.ptr.add(data_offset(SLOTS) + slice.offset as usize);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), at, payload.len());
        }
        fence(Ordering::Release);
        self.placed.fetch_add(slice.len, Ordering::Relaxed);
        PLACED.fetch_add(slice.len, Ordering::Relaxed);
        Some(slice)
    }
}

/// Reserves memory for `len` bytes of `file` from `offset`.
fn reserve(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::other("range too large"));
    };
    // SAFETY: fallocate on an open descriptor; mode 0 only allocates.
    let failed = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) };
    if failed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        // The peer removes the name when it attaches; if it never did.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The peer's region, mapped: where its shared frames' payloads are read.
pub struct Incoming {
    map: Arc<Mapping>,
    /// Payloads are lent (the tensor's bytes stay in the region until it
    /// is dropped) rather than copied out.
    lend: bool,
}

impl Incoming {
    /// Maps the region `name` a peer on this host created (see
    /// [`Outgoing::create`]) and removes its name. Only a file of the
    /// expected name, ours, of a region's size, is mapped. With `lend`,
    /// payloads are not copied out: each one's bytes stay in the region,
    /// held, until the last of them is dropped (a worker's inputs, used
    /// by its run and dropped); without, they are copied out at once (a
    /// requester's outputs, which its caller may keep for as long as it
    /// likes).
    pub fn attach(name: &str, lend: bool) -> std::io::Result<Incoming> {
        let invalid = |why: &str| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name}: {why}"))
        };
        let path = Path::new(name);
        let file_name = path
            .strip_prefix(DIR)
            .ok()
            .and_then(|rest| rest.to_str())
            .filter(|rest| rest.starts_with(PREFIX) && !rest.contains('/') && !rest.contains(".."))
            .ok_or_else(|| invalid("not a Tessera region"))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(Path::new(DIR).join(file_name))?;
        let meta = file.metadata()?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let len = data_offset(SLOTS) as u64 + REGION_BYTES;
        if !meta.is_file() || meta.uid() != me || meta.len() != len {
            return Err(invalid("not a region of this user's of the expected size"));
        }
        let map = Mapping::map(&file, len as usize)?;
        let header = map.header();
        let capacity = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let slots = u32::from_le_bytes(header[16..20].try_into().unwrap_or_default());
        if header[..8] != MAGIC || capacity != REGION_BYTES || slots != SLOTS {
            return Err(invalid("unknown header"));
        }
        let _ = std::fs::remove_file(path);
        map.attached().store(1, Ordering::Release);
        Ok(Incoming {
            map: Arc::new(map),
            lend,
        })
    }
}

impl SharedPayloads for Incoming {
    /// The slice's bytes, lent or copied out (see [`Incoming::attach`]);
    /// either way the slice is released once its bytes are no longer used.
    fn take(&self, slice: &SharedSlice) -> Result<Bytes, WireError> {
        slice.check(SLOTS, REGION_BYTES)?;
        fence(Ordering::Acquire);
        let lease = Lease {
            map: self.map.clone(),
            at: data_offset(SLOTS) + slice.offset as usize,
            len: slice.len as usize,
            word: WORDS_AT + 8 * slice.slot as usize,
            seq: slice.seq,
        };
        if self.lend {
            return Ok(Bytes::from_owner(lease));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(lease.len)
            .map_err(|_| WireError::OutOfMemory(lease.len))?;
        out.extend_from_slice(lease.as_ref());
        Ok(Bytes::from(out))
    }
}

/// A payload's bytes in the peer's region, until dropped; then its slice
/// is released.
struct Lease {
    map: Arc<Mapping>,
    at: usize,
    len: usize,
    word: usize,
    seq: u64,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `take` checked the range against the data area; the
        // mapping lives as long as `self`, and the peer does not reuse the
        // range before the release in `drop`.
        unsafe { std::slice::from_raw_parts(self.map.ptr.add(self.at), self.len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.map.word(self.word).store(self.seq, Ordering::Release);
    }
}

/// A connection's shared memory: the region this side writes, the one it
/// reads, either absent.
#[derive(Default)]
pub struct Shared {
    pub outgoing: Option<Outgoing>,
    pub incoming: Option<Arc<Incoming>>,
}

impl Shared {
    /// The reader's side, for a frame decoder.
    pub fn payloads(&self) -> Option<Arc<dyn SharedPayloads>> {
        self.incoming.clone().map(|i| i as Arc<dyn SharedPayloads>)
    }

    /// Payload bytes sent through shared memory so far.
    pub fn bytes_placed(&self) -> u64 {
        self.outgoing
            .as_ref()
            .map_or(0, |o| o.placed.load(Ordering::Relaxed))
    }

    /// See [`Outgoing::place`].
    pub fn place(&self, payload: &[u8]) -> Option<SharedSlice> {
        self.outgoing.as_ref()?.place(payload)
    }
}

/// Payload bytes this process has sent through shared memory.
static PLACED: AtomicU64 = AtomicU64::new(0);

/// Payload bytes this process has sent through shared memory, on every
/// connection.
pub fn bytes_placed() -> u64 {
    PLACED.load(Ordering::Relaxed)
}

/// Each live connection's shared memory, by `quinn::Connection::stable_id`.
static CONNECTIONS: LazyLock<Mutex<HashMap<usize, Arc<Shared>>>> = LazyLock::new(Default::default);

/// `connection`'s shared memory, if it has any.
pub fn of(connection: &quinn::Connection) -> Option<Arc<Shared>> {
    let connections = CONNECTIONS.lock().unwrap_or_else(|p| p.into_inner());
    connections.get(&connection.stable_id()).cloned()
}

/// Keeps `shared` for `connection` until it closes.
pub(crate) fn register(connection: &quinn::Connection, shared: Shared) {
    if shared.outgoing.is_none() && shared.incoming.is_none() {
        return;
    }
    let shared = Arc::new(shared);
    let id = connection.stable_id();
    CONNECTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, shared.clone());
    let connection = connection.clone();
    tokio::spawn(async move {
        connection.closed().await;
        let mut connections = CONNECTIONS.lock().unwrap_or_else(|p| p.into_inner());
        if connections
            .get(&id)
            .is_some_and(|s| Arc::ptr_eq(s, &shared))
        {
            connections.remove(&id);
        }
    });
}

/// A region for a new connection to a peer on this host (`same_host`);
/// failures fall back to QUIC alone.
pub(crate) fn offer(same_host: bool) -> Option<Outgoing> {
    if !same_host {
        return None;
    }
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep);
    Outgoing::create()
        .inspect_err(|e| tracing::debug!("no shared memory for a same-host peer: {e}"))
        .ok()
}

/// Maps the region a peer on this host (`same_host`) named in its hello,
/// if any, lending its payloads or not (see [`Incoming::attach`]).
pub(crate) fn accept(same_host: bool, name: Option<&str>, lend: bool) -> Option<Arc<Incoming>> {
    let name = name.filter(|_| same_host)?;
    Incoming::attach(name, lend)
        .inspect_err(|e| tracing::debug!("cannot map the peer's shared memory: {e}"))
        .ok()
        .map(Arc::new)
}

/// Removes regions that processes which are gone left unattached (one
/// killed between creating a region and its peer mapping it).
fn sweep() {
    let Ok(entries) = std::fs::read_dir(DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_goes_through_a_region_and_its_name_goes_once_mapped() {
        let out = Outgoing::create().expect("a region in /dev/shm");
        let name = out.name();
        let payload: Vec<u8> = (0..MIN_SHARED * 3).map(|i| (i % 251) as u8).collect();
        // Before the peer maps it, nothing is placed.
        assert!(out.place(&payload).is_none());
        let incoming = Incoming::attach(&name, false).expect("mapped");
        assert!(
            !Path::new(&name).exists(),
            "the name is removed once mapped"
        );
        let slice = out.place(&payload).expect("placed");
        assert_eq!(incoming.take(&slice).expect("read"), payload);
        // Small payloads stay on the stream.
        assert!(out.place(&payload[..100]).is_none());
        // A slice outside the region is an error, not a read.
        let outside = SharedSlice {
            offset: REGION_BYTES,
            ..slice
        };
        assert!(incoming.take(&outside).is_err());
    }

    #[test]
    fn a_lent_payload_holds_its_space_until_dropped() {
        let out = Outgoing::create().expect("a region in /dev/shm");
        let incoming = Incoming::attach(&out.name(), true).expect("mapped");
        let payload = vec![7u8; MIN_SHARED];
        let first = out.place(&payload).expect("placed");
        let lent = incoming.take(&first).expect("lent");
        assert_eq!(lent, payload);
        // Held: the next payload goes elsewhere; dropped: its space again.
        let second = out.place(&payload).expect("placed");
        assert_ne!(second.offset, first.offset);
        drop(incoming.take(&second));
        drop(lent);
        let third = out.place(&payload).expect("placed");
        assert_eq!(third.offset, first.offset);
    }

    #[test]
    fn only_a_tessera_region_is_mapped() {
        for name in [
            "/etc/passwd",
            "/dev/shm/../../etc/passwd",
            "/dev/shm/other-file",
            "relative/tessera-1-2",
        ] {
            assert!(Incoming::attach(name, false).is_err(), "{name}");
        }
        // A file of the right name but not a region's size.
        let path = Path::new(DIR).join(format!("{PREFIX}{}-short", std::process::id()));
        std::fs::write(&path, b"TSSHM").unwrap();
        let name = path.to_string_lossy().into_owned();
        let err = Incoming::attach(&name, false).err().expect("refused");
        assert!(err.to_string().contains("expected size"), "{err}");
        let _ = std::fs::remove_file(&path);
    }
}

//! Payloads through shared memory, for peers on the same host: the pure
//! half (no mapping, no I/O; `tessera-net` maps the memory).
//!
//! Each side of a same-host connection writes the large payloads it sends
//! into a region of memory shared with the peer and sends, in the frame's
//! place on the QUIC stream, a [`SharedSlice`] naming where they are (the
//! frame's prefix has [`super::frame::FLAG_SHARED`] set). The receiver
//! reads the bytes (in place or copied out) and then marks the slice's
//! slot released; the sender's
//! [`SharedAllocator`] reuses the space of released slices. The stream
//! keeps the order, the handshake and TLS keep who may attach: only the
//! bytes bypass QUIC's encryption and datagrams, and they never leave the
//! host.
//!
//! The region: `slots` release words (one `u64` per slot: the sequence
//! number of the last slice released through it), then `capacity` bytes of
//! data.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::WireError;

/// Where a payload lies in the sender's shared region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedSlice {
    /// The release word the receiver sets when it is done with the bytes.
    pub slot: u32,
    /// The value it sets there (unique per slice of a region).
    pub seq: u64,
    /// Offset into the region's data.
    pub offset: u64,
    pub len: u64,
}

impl SharedSlice {
    /// Its size on the stream, in place of the payload.
    pub const LEN: usize = 28;

    pub fn encode(&self) -> [u8; SharedSlice::LEN] {
        let mut out = [0u8; SharedSlice::LEN];
        out[..4].copy_from_slice(&self.slot.to_le_bytes());
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..20].copy_from_slice(&self.offset.to_le_bytes());
        out[20..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SharedSlice, WireError> {
        if bytes.len() != SharedSlice::LEN {
            return Err(WireError::Decode {
                what: "shared-memory slice",
                reason: format!("{} bytes, expected {}", bytes.len(), SharedSlice::LEN),
            });
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        Ok(SharedSlice {
            slot: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            seq: u64_at(4),
            offset: u64_at(12),
            len: u64_at(20),
        })
    }

    /// Checks the slice against a region of `slots` release words and
    /// `capacity` bytes: a slice outside it is a protocol error, never a
    /// read out of bounds.
    pub fn check(&self, slots: u32, capacity: u64) -> Result<(), WireError> {
        let inside = self
            .offset
            .checked_add(self.len)
            .is_some_and(|end| end <= capacity);
        if self.slot >= slots || !inside || self.seq == 0 {
            return Err(WireError::Decode {
                what: "shared-memory slice",
                reason: format!(
                    "slot {} at {}+{} is outside the region ({slots} slots, {capacity} bytes)",
                    self.slot, self.offset, self.len
                ),
            });
        }
        Ok(())
    }
}

/// The receiving side of a same-host connection's shared memory: what
/// [`super::FrameDecoder`] asks for a shared frame's payload.
pub trait SharedPayloads: Send + Sync {
    /// `slice`'s bytes from the peer's region; the slice is released once
    /// they are no longer used.
    fn take(&self, slice: &SharedSlice) -> Result<Bytes, WireError>;
}

/// Payloads are placed at multiples of this (a cache line; every element
/// type's alignment).
pub const ALIGN: u64 = 64;

/// A slice handed out and not yet released.
#[derive(Debug, Clone, Copy)]
struct Block {
    len: u64,
    slot: u32,
    seq: u64,
}

/// The sender's bookkeeping of its region: which ranges and slots are in
/// flight. Space is found first-fit from the region's start, so the part
/// of the region ever written (and the memory it takes) stays as large as
/// the most bytes ever in flight at once, not the region's size; it is
/// reclaimed slice by slice as their release words show them copied, in any
/// order: a slice the receiver never reads (its stream was reset) holds
/// only its own space.
#[derive(Debug)]
pub struct SharedAllocator {
    capacity: u64,
    /// In flight, by offset.
    live: BTreeMap<u64, Block>,
    free_slots: Vec<u32>,
    next_seq: u64,
}

impl SharedAllocator {
    pub fn new(capacity: u64, slots: u32) -> SharedAllocator {
        SharedAllocator {
            capacity,
            live: BTreeMap::new(),
            free_slots: (0..slots).rev().collect(),
            next_seq: 1,
        }
    }

    /// Room for `len` bytes, or `None` (the region is full or the payload
    /// larger than it: the caller sends it on the stream instead).
    /// `released(slot)` reads a slot's release word.
    pub fn allocate(&mut self, len: u64, released: impl Fn(u32) -> u64) -> Option<SharedSlice> {
        self.reclaim(released);
        let reserved = len.checked_next_multiple_of(ALIGN)?.max(ALIGN);
        if reserved > self.capacity {
            return None;
        }
        let slot = *self.free_slots.last()?;
        let offset = self.gap(reserved)?;
        self.free_slots.pop();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live.insert(
            offset,
            Block {
                len: reserved,
                slot,
                seq,
            },
        );
        Some(SharedSlice {
            slot,
            seq,
            offset,
            len,
        })
    }

    /// Gives back a slice that was not sent after all.
    pub fn cancel(&mut self, slice: &SharedSlice) {
        if self
            .live
            .get(&slice.offset)
            .is_some_and(|b| b.seq == slice.seq)
        {
            self.live.remove(&slice.offset);
            self.free_slots.push(slice.slot);
        }
    }

    /// Slices in flight and the bytes they hold.
    pub fn in_flight(&self) -> (usize, u64) {
        (self.live.len(), self.live.values().map(|b| b.len).sum())
    }

    fn reclaim(&mut self, released: impl Fn(u32) -> u64) {
        let free_slots = &mut self.free_slots;
        self.live.retain(|_, b| {
            let done = released(b.slot) == b.seq;
            if done {
                free_slots.push(b.slot);
            }
            !done
        });
    }

    /// The first offset with `len` free bytes after it.
    fn gap(&self, len: u64) -> Option<u64> {
        let mut at = 0;
        for (&offset, block) in &self.live {
            if offset >= at && offset - at >= len {
                return Some(at);
            }
            at = at.max(offset + block.len);
        }
        (self.capacity >= at && self.capacity - at >= len).then_some(at)
    }
}

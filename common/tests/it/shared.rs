//! Same-host payloads in shared memory, the pure half: slices on the wire,
//! the sender's allocator, the decoder reading a shared frame.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tessera_common::tensor::Tensor;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::shared::{SharedAllocator, SharedPayloads, SharedSlice, ALIGN};
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, FrameDecoder, Limits, Prefix, WireError};

/// Release words, as the receiver sets them.
#[derive(Default)]
struct Words(RefCell<HashMap<u32, u64>>);

impl Words {
    fn release(&self, slice: &SharedSlice) {
        self.0.borrow_mut().insert(slice.slot, slice.seq);
    }
    fn read(&self) -> impl Fn(u32) -> u64 + '_ {
        |slot| self.0.borrow().get(&slot).copied().unwrap_or(0)
    }
}

#[test]
fn a_slice_round_trips_and_is_checked_against_its_region() {
    let slice = SharedSlice {
        slot: 3,
        seq: 9,
        offset: 128,
        len: 1000,
    };
    assert_eq!(SharedSlice::decode(&slice.encode()), Ok(slice));
    assert!(SharedSlice::decode(&slice.encode()[..10]).is_err());
    assert!(slice.check(4, 1128).is_ok());
    // The slot past the words, the range past the data, an overflowing
    // offset, a sequence number no slice has: all refused.
    assert!(slice.check(3, 1128).is_err());
    assert!(slice.check(4, 1127).is_err());
    let huge = SharedSlice {
        offset: u64::MAX,
        ..slice
    };
    assert!(huge.check(4, u64::MAX).is_err());
    let unnumbered = SharedSlice { seq: 0, ..slice };
    assert!(unnumbered.check(4, 1128).is_err());
}

#[test]
fn the_allocator_reuses_the_regions_start_while_the_receiver_keeps_up() {
    let words = Words::default();
    let mut alloc = SharedAllocator::new(4096, 8);
    // Read before the next is sent: always the same place, so the memory
    // the region takes is the most in flight at once.
    for _ in 0..10 {
        let slice = alloc.allocate(1000, words.read()).expect("room");
        assert_eq!((slice.offset, slice.len), (0, 1000));
        words.release(&slice);
    }
    // Two in flight: side by side, at multiples of ALIGN.
    let a = alloc.allocate(100, words.read()).expect("room");
    let b = alloc.allocate(100, words.read()).expect("room");
    assert_eq!((a.offset, b.offset), (0, 128));
    assert_eq!(b.offset % ALIGN, 0);
    assert_eq!(alloc.in_flight(), (2, 256));
    // One not sent after all is given back.
    alloc.cancel(&b);
    assert_eq!(alloc.in_flight(), (1, 128));
}

#[test]
fn a_full_region_or_an_oversized_payload_gets_no_slice() {
    let words = Words::default();
    let mut alloc = SharedAllocator::new(4096, 8);
    assert!(alloc.allocate(4097, words.read()).is_none());
    let held: Vec<_> = (0..4)
        .map(|_| alloc.allocate(1024, words.read()).expect("room"))
        .collect();
    assert!(alloc.allocate(1, words.read()).is_none());
    assert_eq!(alloc.in_flight(), (4, 4096));
    // Released out of order: the second's space is used again at once,
    // the first (never read, say) keeps only its own.
    words.release(&held[1]);
    let again = alloc.allocate(1000, words.read()).expect("room");
    assert_eq!(again.offset, held[1].offset);
    assert_ne!(again.seq, held[1].seq);
    assert!(alloc.allocate(1, words.read()).is_none());
}

#[test]
fn slots_bound_the_slices_in_flight() {
    let words = Words::default();
    let mut alloc = SharedAllocator::new(1 << 20, 2);
    let a = alloc.allocate(10, words.read()).expect("room");
    let b = alloc.allocate(10, words.read()).expect("room");
    assert_ne!(a.slot, b.slot);
    assert!(alloc.allocate(10, words.read()).is_none());
    words.release(&a);
    let c = alloc.allocate(10, words.read()).expect("a slot again");
    assert_eq!(c.slot, a.slot);
    // The slot's old release word does not release its new slice.
    assert!(alloc.allocate(10, words.read()).is_none());
    assert_eq!(alloc.in_flight().0, 2);
}

/// A region in this process: what the peer wrote, by offset.
struct Region {
    data: Vec<u8>,
    released: Mutex<Vec<u64>>,
}

impl SharedPayloads for Region {
    fn take(&self, slice: &SharedSlice) -> Result<Bytes, WireError> {
        slice.check(4, self.data.len() as u64)?;
        self.released.lock().unwrap().push(slice.seq);
        let start = slice.offset as usize;
        Ok(Bytes::copy_from_slice(
            &self.data[start..start + slice.len as usize],
        ))
    }
}

#[test]
fn a_shared_frame_decodes_as_the_tensor_it_names() {
    let limits = Limits::default();
    let t = Tensor::from_values(vec![2, 3], &[1f32, 2., 3., 4., 5., 6.]).unwrap();
    let head = TensorHeader::new(7, 42, "x", &t).encode(&limits).unwrap();
    let slice = SharedSlice {
        slot: 1,
        seq: 5,
        offset: 64,
        len: t.bytes().len() as u64,
    };
    let frame = Prefix::shared_frame(&head, &slice).unwrap();
    let mut data = vec![0u8; 256];
    data[64..64 + t.bytes().len()].copy_from_slice(t.bytes());
    let region = Arc::new(Region {
        data,
        released: Mutex::default(),
    });

    let mut decoder = FrameDecoder::<PeerMessage>::new(limits)
        .with_shared(Some(region.clone() as Arc<dyn SharedPayloads>));
    decoder.push(&frame).unwrap();
    let Some(Frame::Tensor(h, payload)) = decoder.next_frame().unwrap() else {
        panic!("no tensor")
    };
    assert_eq!(h.into_tensor(payload).unwrap(), t);
    assert_eq!(*region.released.lock().unwrap(), [5]);

    // Without shared memory, or naming bytes outside the region: errors.
    let mut plain = FrameDecoder::<PeerMessage>::new(limits);
    plain.push(&frame).unwrap();
    assert!(plain.next_frame().is_err());
    let outside = SharedSlice {
        offset: 250,
        ..slice
    };
    let mut decoder = FrameDecoder::<PeerMessage>::new(limits)
        .with_shared(Some(region as Arc<dyn SharedPayloads>));
    decoder
        .push(&Prefix::shared_frame(&head, &outside).unwrap())
        .unwrap();
    assert!(decoder.next_frame().is_err());
}

#[test]
fn prefixes_with_unknown_flags_or_a_misfit_shared_payload_are_refused() {
    let limits = Limits::default();
    let t = Tensor::from_values(vec![1], &[1f32]).unwrap();
    let head = TensorHeader::new(1, 1, "x", &t).encode(&limits).unwrap();
    let mut raw = [0u8; Prefix::LEN];
    raw.copy_from_slice(&head[..Prefix::LEN]);
    raw[3] = 0x80;
    assert!(Prefix::decode(&raw, &limits).is_err());
    // The shared flag on a frame whose payload is not a slice.
    raw[3] = 1;
    assert!(Prefix::decode(&raw, &limits).is_err());
}

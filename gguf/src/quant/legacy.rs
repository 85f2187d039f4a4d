//! The legacy types, blocks of 32: a float16 factor (and minimum), then
//! the values, the first 16 in the low nibbles of 16 bytes and the next 16
//! in their high nibbles (Q5's fifth bits in a 32-bit word before them).

use super::{half_at, pack, Factors, Halves, Packed};

const BLOCK: usize = 32;

/// A legacy block's 16 bytes of nibbles as its 32 values in order.
fn nibbles(qs: &[u8], out: &mut [u8; BLOCK]) {
    for j in 0..16 {
        out[j] = qs[j] & 0x0F;
        out[j + 16] = qs[j] >> 4;
    }
}

/// A Q5 block's fifth bits (value j's in bit j of the word) added as 16s.
fn fifth_bits(qh: &[u8], values: &mut [u8; BLOCK]) {
    let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, v) in values.iter_mut().enumerate() {
        *v |= (((bits >> j) & 1) as u8) << 4;
    }
}

/// A legacy type's block: its size, the bits its values are stored in,
/// their zero point and where its minimum is (the factor is at 0).
struct Layout {
    size: usize,
    bits: u8,
    zero_point: u8,
    minimum_at: Option<usize>,
}

/// Decodes `rows × cols / 32` blocks: `values` fills each block's 32
/// values (as stored, zero point included).
fn decode(
    bytes: &[u8],
    (rows, cols): (usize, usize),
    layout: Layout,
    values: impl Fn(&[u8], &mut [u8; BLOCK]),
) -> Packed {
    let Layout {
        size,
        bits,
        zero_point,
        minimum_at,
    } = layout;
    let blocks = rows * cols / BLOCK;
    let mut blobs = Vec::with_capacity(blocks * BLOCK * bits as usize / 8);
    let mut scales = Vec::with_capacity(blocks);
    let mut minimums = minimum_at.map(|_| Vec::with_capacity(blocks));
    let mut v = [0u8; BLOCK];
    for block in bytes.chunks_exact(size) {
        values(block, &mut v);
        pack(&v, bits, &mut blobs);
        scales.push(half_at(block, 0));
        if let (Some(m), Some(at)) = (minimums.as_mut(), minimum_at) {
            m.push(half_at(block, at));
        }
    }
    Packed {
        rows,
        cols,
        bits,
        block: BLOCK,
        blobs: blobs.into(),
        scales: Factors::Half(Halves::from_bits(&scales)),
        zero_point,
        minimums: minimums.map(|m| Factors::Half(Halves::from_bits(&m))),
    }
}

/// Q4_0 (18 bytes): d, 16 bytes of nibbles; w = d * (q - 8).
pub fn q4_0(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    let layout = Layout {
        size: 18,
        bits: 4,
        zero_point: 8,
        minimum_at: None,
    };
    decode(bytes, (rows, cols), layout, |b, v| nibbles(&b[2..18], v))
}

/// Q4_1 (20 bytes): d, m, 16 bytes of nibbles; w = d * q + m.
pub fn q4_1(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    let layout = Layout {
        size: 20,
        bits: 4,
        zero_point: 0,
        minimum_at: Some(2),
    };
    decode(bytes, (rows, cols), layout, |b, v| nibbles(&b[4..20], v))
}

/// Q5_0 (22 bytes): d, 4 bytes of fifth bits, 16 of nibbles;
/// w = d * (q - 16), stored as q + 112 (zero point 128).
pub fn q5_0(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    let layout = Layout {
        size: 22,
        bits: 8,
        zero_point: 128,
        minimum_at: None,
    };
    decode(bytes, (rows, cols), layout, |b, v| {
        nibbles(&b[6..22], v);
        fifth_bits(&b[2..6], v);
        v.iter_mut().for_each(|x| *x += 112);
    })
}

/// Q5_1 (24 bytes): d, m, 4 bytes of fifth bits, 16 of nibbles;
/// w = d * q + m, stored as q + 128.
pub fn q5_1(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    let layout = Layout {
        size: 24,
        bits: 8,
        zero_point: 128,
        minimum_at: Some(2),
    };
    decode(bytes, (rows, cols), layout, |b, v| {
        nibbles(&b[8..24], v);
        fifth_bits(&b[4..8], v);
        v.iter_mut().for_each(|x| *x += 128);
    })
}

/// Q8_0 (34 bytes): d, 32 int8; w = d * q, stored as q + 128.
pub fn q8_0(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    let layout = Layout {
        size: 34,
        bits: 8,
        zero_point: 128,
        minimum_at: None,
    };
    decode(bytes, (rows, cols), layout, |b, v| {
        for (x, &q) in v.iter_mut().zip(&b[2..34]) {
            *x = q ^ 0x80;
        }
    })
}

//! The K-quants: super-blocks of 256 values with a float16 factor (and
//! minimum factor) each and small integer factors per block of 16 or 32.
//! Each decoder writes a super-block's values in order (as stored: zero
//! point included), its blocks' integer factors and its float16s.

use super::{half_at, pack, Factors, Halves, Packed};

const SUPER: usize = 256;

/// What one super-block holds, decoded.
struct Super {
    values: [u8; SUPER],
    /// Integer factor of each block (up to 16 blocks).
    scales: [u8; 16],
    minimums: [u8; 16],
}

/// How a K-quant is laid out and turned into a [`Packed`] weight.
struct Layout {
    size: usize,
    bits: u8,
    block: usize,
    zero_point: u8,
    /// Byte offsets of the float16 factor and minimum factor.
    d_at: usize,
    dmin_at: Option<usize>,
    signed: bool,
    decode: fn(&[u8], &mut Super),
}

fn decode(bytes: &[u8], rows: usize, cols: usize, layout: &Layout) -> Packed {
    let supers = rows * cols / SUPER;
    let per_super = SUPER / layout.block;
    let mut blobs = Vec::with_capacity(supers * SUPER * layout.bits as usize / 8);
    let (mut d, mut fine) = (
        Vec::with_capacity(supers),
        Vec::with_capacity(supers * per_super),
    );
    let with_min = layout.dmin_at.is_some();
    let (mut dmin, mut fine_min) = (Vec::new(), Vec::new());
    let mut s = Super {
        values: [0; SUPER],
        scales: [0; 16],
        minimums: [0; 16],
    };
    for block in bytes.chunks_exact(layout.size) {
        (layout.decode)(block, &mut s);
        pack(&s.values, layout.bits, &mut blobs);
        d.push(half_at(block, layout.d_at));
        fine.extend_from_slice(&s.scales[..per_super]);
        if let Some(at) = layout.dmin_at {
            // The minimum is subtracted: its factor negated (exact).
            dmin.push(half_at(block, at) ^ 0x8000);
            fine_min.extend_from_slice(&s.minimums[..per_super]);
        }
    }
    Packed {
        rows,
        cols,
        bits: layout.bits,
        block: layout.block,
        blobs: blobs.into(),
        scales: Factors::Split {
            coarse: Halves::from_bits(&d),
            fine: fine.into(),
            signed: layout.signed,
        },
        zero_point: layout.zero_point,
        minimums: with_min.then(|| Factors::Split {
            coarse: Halves::from_bits(&dmin),
            fine: fine_min.into(),
            signed: false,
        }),
    }
}

/// Q2_K (84 bytes): 16 bytes of 4-bit factor | 4-bit minimum per block of
/// 16, 64 bytes of 2-bit values, d, dmin. Value 128n + 32j + l is bits
/// 2j of byte 32n + l; w = d * sc * q - dmin * m.
pub fn q2_k(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    fn values(b: &[u8], s: &mut Super) {
        for (i, &sc) in b[..16].iter().enumerate() {
            s.scales[i] = sc & 0x0F;
            s.minimums[i] = sc >> 4;
        }
        let qs = &b[16..80];
        for (i, v) in s.values.iter_mut().enumerate() {
            let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
            *v = (qs[32 * n + l] >> (2 * j)) & 3;
        }
    }
    decode(
        bytes,
        rows,
        cols,
        &Layout {
            size: 84,
            bits: 2,
            block: 16,
            zero_point: 0,
            d_at: 80,
            dmin_at: Some(82),
            signed: false,
            decode: values,
        },
    )
}

/// Q3_K (110 bytes): 32 bytes of high bits, 64 of low 2-bit pairs, 12 of
/// 6-bit factors, d. Value 128n + 32j + l: low bits 2j of byte 32n + l,
/// high bit 4n + j of byte l; w = d * (sc - 32) * (q - 4).
pub fn q3_k(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    fn values(b: &[u8], s: &mut Super) {
        let (hmask, qs) = (&b[..32], &b[32..96]);
        let word = |k: usize| u32::from_le_bytes([b[96 + k], b[97 + k], b[98 + k], b[99 + k]]);
        let (a0, a1, tmp) = (word(0), word(4), word(8));
        let (m1, m2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
        let aux = [
            (a0 & m2) | ((tmp & m1) << 4),
            (a1 & m2) | (((tmp >> 2) & m1) << 4),
            ((a0 >> 4) & m2) | (((tmp >> 4) & m1) << 4),
            ((a1 >> 4) & m2) | (((tmp >> 6) & m1) << 4),
        ];
        for (i, sc) in s.scales.iter_mut().enumerate() {
            let six = (aux[i / 4] >> (8 * (i % 4))) as u8;
            *sc = six.wrapping_sub(32);
        }
        for (i, v) in s.values.iter_mut().enumerate() {
            let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
            let low = (qs[32 * n + l] >> (2 * j)) & 3;
            let high = (hmask[l] >> (4 * n + j)) & 1;
            *v = low | (high << 2);
        }
    }
    decode(
        bytes,
        rows,
        cols,
        &Layout {
            size: 110,
            bits: 4,
            block: 16,
            zero_point: 4,
            d_at: 108,
            dmin_at: None,
            signed: true,
            decode: values,
        },
    )
}

/// Q4_K/Q5_K's 12 bytes of eight 6-bit factors and minimums (ggml's
/// get_scale_min_k4).
fn k4_factors(packed: &[u8], s: &mut Super) {
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (packed[j] & 63, packed[j + 4] & 63)
        } else {
            (
                (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
                (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
            )
        };
        s.scales[j] = sc;
        s.minimums[j] = m;
    }
}

/// Q4_K (144 bytes): d, dmin, 12 bytes of factors, 128 of nibbles: block
/// b's values in the low (b even) or high (b odd) nibbles of bytes
/// 32 (b / 2) ..; w = d * sc * q - dmin * m.
pub fn q4_k(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    fn values(b: &[u8], s: &mut Super) {
        k4_factors(&b[4..16], s);
        let qs = &b[16..144];
        for (i, v) in s.values.iter_mut().enumerate() {
            let (blk, l) = (i / 32, i % 32);
            *v = (qs[32 * (blk / 2) + l] >> (4 * (blk % 2))) & 0x0F;
        }
    }
    decode(
        bytes,
        rows,
        cols,
        &Layout {
            size: 144,
            bits: 4,
            block: 32,
            zero_point: 0,
            d_at: 0,
            dmin_at: Some(2),
            signed: false,
            decode: values,
        },
    )
}

/// Q5_K (176 bytes): Q4_K's fields with 32 bytes of fifth bits before the
/// nibbles (block b's in bit b of byte l); stored as q + 128.
pub fn q5_k(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    fn values(b: &[u8], s: &mut Super) {
        k4_factors(&b[4..16], s);
        let (qh, qs) = (&b[16..48], &b[48..176]);
        for (i, v) in s.values.iter_mut().enumerate() {
            let (blk, l) = (i / 32, i % 32);
            let low = (qs[32 * (blk / 2) + l] >> (4 * (blk % 2))) & 0x0F;
            let high = (qh[l] >> blk) & 1;
            *v = (low | (high << 4)) + 128;
        }
    }
    decode(
        bytes,
        rows,
        cols,
        &Layout {
            size: 176,
            bits: 8,
            block: 32,
            zero_point: 128,
            d_at: 0,
            dmin_at: Some(2),
            signed: false,
            decode: values,
        },
    )
}

/// Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16
/// int8 factors (one per block of 16), d. Value 128n + 32k + l: its
/// nibble from byte 64n + l (+ 32 for odd k; the high nibble for k ≥ 2),
/// its high bits 2k of byte 32n + l; w = d * sc * (q - 32), stored as
/// q + 96.
pub fn q6_k(bytes: &[u8], rows: usize, cols: usize) -> Packed {
    fn values(b: &[u8], s: &mut Super) {
        let (ql, qh) = (&b[..128], &b[128..192]);
        s.scales.copy_from_slice(&b[192..208]);
        for (i, v) in s.values.iter_mut().enumerate() {
            let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
            let byte = ql[64 * n + l + 32 * (k % 2)];
            let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
            let high = (qh[32 * n + l] >> (2 * k)) & 3;
            *v = (low | (high << 4)) + 96;
        }
    }
    decode(
        bytes,
        rows,
        cols,
        &Layout {
            size: 210,
            bits: 8,
            block: 16,
            zero_point: 128,
            d_at: 208,
            dmin_at: None,
            signed: true,
            decode: values,
        },
    )
}

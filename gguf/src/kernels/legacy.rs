//! llama.cpp's 32-weight blocks against 8-bit activations: Q4_0 and Q5_0
//! against Q8_0 (`ggml_vec_dot_q4_0_q8_0`, `…q5_0_q8_0`), Q4_1 and Q5_1
//! against Q8_1 (`…q4_1_q8_1`, `…q5_1_q8_1`: the activations' sums times
//! the blocks' minimums). Blocks: Q4_0 float16 d, 16 bytes of nibbles
//! (weight j the low nibble of byte j, weight j + 16 the high one), value
//! d (q − 8); Q5_0 adds 4 bytes of fifth bits (value d (q − 16)); Q4_1 and
//! Q5_1 a float16 minimum m after d (value d q + m).

use super::q80::BlockQ80;
use super::{f16_at, Simd};

/// 32 activations as 8-bit integers, their factor and `d · Σq` (llama.cpp's
/// `block_q8_1`; both float16 values).
#[derive(Clone, Copy)]
pub struct BlockQ81 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}

/// `x` as llama.cpp's CPU backend quantizes activations for Q4_1 and
/// Q5_1: Q8_0's rounding, and the sum of each block's values times d
/// (max|x| / 127 before its rounding to float16) stored as float16.
pub fn quantize_q8_1(x: &[f32]) -> Vec<BlockQ81> {
    super::q80::quantize(x)
        .into_iter()
        .zip(x.chunks_exact(32))
        .map(|(b, xb)| {
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
            BlockQ81 {
                d: b.d,
                s: half::f16::from_f32(d * sum as f32).to_f32(),
                qs: b.qs,
            }
        })
        .collect()
}

/// Each block's layout: bytes, where its nibbles and fifth bits start,
/// whether it has a minimum, and the offset taken from unsigned values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    size: usize,
    nibbles: usize,
    fifth: Option<usize>,
    offset: i32,
}

pub const Q4_0: Layout = Layout {
    size: 18,
    nibbles: 2,
    fifth: None,
    offset: 8,
};
pub const Q5_0: Layout = Layout {
    size: 22,
    nibbles: 6,
    fifth: Some(2),
    offset: 16,
};
pub const Q4_1: Layout = Layout {
    size: 20,
    nibbles: 4,
    fifth: None,
    offset: 0,
};
pub const Q5_1: Layout = Layout {
    size: 24,
    nibbles: 8,
    fifth: Some(4),
    offset: 0,
};

/// A block's 32 unsigned values (nibbles with their fifth bits).
fn values(b: &[u8], l: Layout) -> [i32; 32] {
    let high = l.fifth.map_or(0, |at| {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    });
    let mut v = [0i32; 32];
    for j in 0..16 {
        let q = b[l.nibbles + j];
        v[j] = i32::from(q & 0xF) | ((((high >> j) & 1) as i32) << 4);
        v[j + 16] = i32::from(q >> 4) | ((((high >> (j + 16)) & 1) as i32) << 4);
    }
    v
}

/// Q8_0's blocks as this file's kernels take them (32 signed bytes).
pub const Q8_0: Layout = Layout {
    size: 34,
    nibbles: 0,
    fifth: None,
    offset: 0,
};

/// A Q4_0, Q5_0 or Q8_0 row against Q8_0 activations.
pub fn dot_q8_0(w: &[u8], a: &[BlockQ80], l: Layout, simd: Simd) -> f32 {
    if l == Q8_0 {
        return match simd {
            // SAFETY: as below.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 if super::vnni() => unsafe { x86::dot_q8_0_vnni::<34, 0, 0, 0>(w, a) },
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 | Simd::Avx2 => unsafe { x86::dot_q8_0::<34, 0, 0, 0>(w, a) },
            _ => super::q80::dot_portable(w, a),
        };
    }
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`);
        // each layout is its own loop, its unpacking known when compiled.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 if super::vnni() && l == Q4_0 => unsafe {
            x86::dot_q8_0_vnni::<18, 2, 0, 8>(w, a)
        },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 if super::vnni() => unsafe { x86::dot_q8_0_vnni::<22, 6, 2, 16>(w, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 if l == Q4_0 => unsafe { x86::dot_q8_0::<18, 2, 0, 8>(w, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 => unsafe { x86::dot_q8_0::<22, 6, 2, 16>(w, a) },
        _ => dot_q8_0_portable(w, a, l),
    }
}

/// A Q4_1 or Q5_1 row against Q8_1 activations.
pub fn dot_q8_1(w: &[u8], a: &[BlockQ81], l: Layout, simd: Simd) -> f32 {
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 if super::vnni() && l == Q4_1 => unsafe {
            x86::dot_q8_1_vnni::<20, 4, 0>(w, a)
        },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 if super::vnni() => unsafe { x86::dot_q8_1_vnni::<24, 8, 4>(w, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 if l == Q4_1 => unsafe { x86::dot_q8_1::<20, 4, 0>(w, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 => unsafe { x86::dot_q8_1::<24, 8, 4>(w, a) },
        _ => dot_q8_1_portable(w, a, l),
    }
}

pub fn dot_q8_0_portable(w: &[u8], a: &[BlockQ80], l: Layout) -> f32 {
    w.chunks_exact(l.size)
        .zip(a)
        .map(|(b, y)| {
            let v = values(b, l);
            let sumi: i32 = (0..32)
                .map(|j| (v[j] - l.offset) * i32::from(y.qs[j]))
                .sum();
            sumi as f32 * (f16_at(b, 0) * y.d)
        })
        .sum()
}

pub fn dot_q8_1_portable(w: &[u8], a: &[BlockQ81], l: Layout) -> f32 {
    let (mut acc, mut mins) = (0f32, 0f32);
    for (b, y) in w.chunks_exact(l.size).zip(a) {
        let v = values(b, l);
        let sumi: i32 = (0..32).map(|j| v[j] * i32::from(y.qs[j])).sum();
        acc += sumi as f32 * (f16_at(b, 0) * y.d);
        mins += f16_at(b, 2) * y.s;
    }
    acc + mins
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BlockQ80, BlockQ81};

    /// A float16 at `p` as float32, by a table of every float16 as
    /// llama.cpp converts them (`ggml_table_f32_f16`): converting one by
    /// F16C, the compiler loads it with an insert that merges into a live
    /// register (the running sum), chaining every block's work onto the
    /// last's (2.5× slower).
    #[inline(always)]
    unsafe fn half(table: &[f32], p: *const u8) -> f32 {
        let bits = u16::from_le((p as *const u16).read_unaligned());
        // SAFETY: the table holds all 65,536 values.
        *table.get_unchecked(usize::from(bits))
    }

    /// ggml's `bytes_from_nibbles_32`: the low nibbles of 16 bytes, then
    /// their high nibbles.
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
        _mm256_and_si256(bytes, _mm256_set1_epi8(0xF))
    }

    /// ggml's `bytes_from_bits_32`: 0xFF where a bit of the 32 is set.
    #[target_feature(enable = "avx2")]
    unsafe fn bits(p: *const u8) -> __m256i {
        let x32 = i32::from_le((p as *const i32).read_unaligned());
        let shuffle = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuffle);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    /// A block's values (nibbles at `NIB`, fifth bits at `FIFTH` where not
    /// 0; `NIB` 0: Q8_0's bytes), less `OFFSET`: Q5_0's q − 16 is q | 0xF0
    /// where the fifth bit is clear; Q5_1's fifth bit is 0x10.
    #[target_feature(enable = "avx2")]
    unsafe fn block<const NIB: usize, const FIFTH: usize, const OFFSET: i8>(
        b: *const u8,
    ) -> __m256i {
        if NIB == 0 {
            // Q8_0: 32 signed bytes after d.
            return _mm256_loadu_si256(b.add(2) as *const __m256i);
        }
        let q = nibbles(b.add(NIB));
        if FIFTH == 0 {
            return if OFFSET == 0 {
                q
            } else {
                _mm256_sub_epi8(q, _mm256_set1_epi8(OFFSET))
            };
        }
        let bits = bits(b.add(FIFTH));
        if OFFSET == 16 {
            _mm256_or_si256(q, _mm256_andnot_si256(bits, _mm256_set1_epi8(0xF0u8 as i8)))
        } else {
            _mm256_or_si256(q, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)))
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn hsum(acc: __m256) -> f32 {
        let v = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }

    /// Every block into one sum in order, as llama.cpp adds them (so the
    /// float32 results are its own): `one(acc, block, activations)` adds a
    /// block.
    #[inline(always)]
    unsafe fn blocks<A>(
        w: &[u8],
        a: &[A],
        size: usize,
        one: impl Fn(__m256, &[u8], &A) -> __m256,
    ) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (b, y) in w.chunks_exact(size).zip(a) {
            acc = one(acc, b, y);
        }
        hsum(acc)
    }

    /// The kernels for one instruction set: `$sum(x, y)` sums the byte
    /// products x·y (x unsigned, y signed) of each four into int32 lanes.
    macro_rules! kernels {
        ($features:literal, $q8_0:ident, $q8_1:ident, $sum:expr) => {
            /// llama.cpp's kernels for Q4_0 and Q5_0 (`mul_sum_i8_pairs_float`:
            /// the weights' signs moved onto the activations).
            #[target_feature(enable = $features)]
            pub unsafe fn $q8_0<
                const SIZE: usize,
                const NIB: usize,
                const FIFTH: usize,
                const OFFSET: i8,
            >(
                w: &[u8],
                a: &[BlockQ80],
            ) -> f32 {
                let table = super::super::f16_table();
                blocks(w, a, SIZE, |acc, b, y| {
                    let d = _mm256_set1_ps(half(table, b.as_ptr()) * y.d);
                    let qx = block::<NIB, FIFTH, OFFSET>(b.as_ptr());
                    let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                    let dot = $sum(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
                    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc)
                })
            }

            /// llama.cpp's kernels for Q4_1 and Q5_1 (`mul_sum_us8_pairs_float`,
            /// and the minimums' sum apart).
            #[target_feature(enable = $features)]
            pub unsafe fn $q8_1<const SIZE: usize, const NIB: usize, const FIFTH: usize>(
                w: &[u8],
                a: &[BlockQ81],
            ) -> f32 {
                let table = super::super::f16_table();
                let mins = std::cell::Cell::new(0f32);
                let dots = blocks(w, a, SIZE, |acc, b, y| {
                    mins.set(mins.get() + half(table, b.as_ptr().add(2)) * y.s);
                    let d = _mm256_set1_ps(half(table, b.as_ptr()) * y.d);
                    let qx = block::<NIB, FIFTH, 0>(b.as_ptr());
                    let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($sum(qx, qy)), acc)
                });
                dots + mins.get()
            }
        };
    }

    kernels!("avx2,fma,f16c", dot_q8_0, dot_q8_1, |x, y| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    });
    // One instruction for the two (AVX-512 VNNI on 256 bits), as llama.cpp
    // built for this CPU does.
    kernels!(
        "avx2,fma,f16c,avx512vnni,avx512vl",
        dot_q8_0_vnni,
        dot_q8_1_vnni,
        |x, y| _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    );
}

//! Q4_K weights against Q8_K activations (llama.cpp's
//! `ggml_vec_dot_q4_K_q8_K`, and `quantize_row_q8_K_ref` for the
//! activations). A Q4_K super-block (144 bytes, 256 weights): float16 `d`
//! and `dmin`, 12 bytes of eight 6-bit scales and minimums, 128 bytes of
//! nibbles; weight = d·sc·q − dmin·m per block of 32.

use super::{f16_at, nearest_int, Simd};

/// 256 activations as 8-bit integers with a float32 factor and the sums
/// of each 16 (llama.cpp's `block_q8_K`).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
    /// `qs` in the order the 512-bit Q4_K kernel takes them: for each half
    /// of 128, the first and third 32 (the blocks the low nibbles of its
    /// 64 bytes hold), then the second and fourth (the high nibbles').
    pub qx: [i8; 256],
    /// The sums of each 32 (pairs of `bsums`), for the minimums' term.
    pub sums32: [i16; 8],
}

/// `x` (whole blocks of 256) as llama.cpp quantizes activations for the
/// K-quants: per block, factor max/−127 of the value of largest magnitude.
pub fn quantize_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    x.chunks_exact(256)
        .map(|xb| {
            let mut y = BlockQ8K {
                d: 0.0,
                qs: [0; 256],
                bsums: [0; 16],
                qx: [0; 256],
                sums32: [0; 8],
            };
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                return y;
            }
            let iscale = -127.0 / max;
            for (q, &v) in y.qs.iter_mut().zip(xb) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (j, s) in y.bsums.iter_mut().enumerate() {
                *s = y.qs[16 * j..16 * j + 16]
                    .iter()
                    .map(|&q| i16::from(q))
                    .sum();
            }
            for (j, s) in y.sums32.iter_mut().enumerate() {
                *s = y.bsums[2 * j] + y.bsums[2 * j + 1];
            }
            for k in 0..2 {
                for (to, from) in [(0, 0), (32, 64), (64, 32), (96, 96)] {
                    let (to, from) = (128 * k + to, 128 * k + from);
                    y.qx[to..to + 32].copy_from_slice(&y.qs[from..from + 32]);
                }
            }
            y.d = 1.0 / iscale;
            y
        })
        .collect()
}

/// Rows of activations a weight row meets at once in a prompt.
pub const ROWS_AT_ONCE: usize = 4;

/// `w` against `ROWS_AT_ONCE` activation rows, where the CPU has a kernel
/// for that (AVX-512); `None` otherwise.
pub fn dot_rows(
    w: &[u8],
    a: [&[BlockQ8K]; ROWS_AT_ONCE],
    simd: Simd,
) -> Option<[f32; ROWS_AT_ONCE]> {
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => Some(unsafe { x86::dot_rows_avx512(w, a) }),
        _ => None,
    }
}

pub fn dot(w: &[u8], a: &[BlockQ8K], simd: Simd) -> f32 {
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { x86::dot_avx512(w, a) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { x86::dot_avx2(w, a) },
        _ => dot_portable(w, a),
    }
}

/// Block j's 6-bit scale and minimum (ggml's `get_scale_min_k4`).
fn scale_min(q: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub fn dot_portable(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (b, y) in w.chunks_exact(144).zip(a) {
        let (d, dmin) = (f16_at(b, 0) * y.d, f16_at(b, 2) * y.d);
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min(&b[4..16], j);
            let qs = &b[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
            let dot: i32 = qs
                .iter()
                .zip(&y.qs[32 * j..32 * j + 32])
                .map(|(&q, &a)| i32::from((q >> (4 * (j % 2))) & 0xF) * i32::from(a))
                .sum();
            isum += i32::from(sc) * dot;
            msum += i32::from(m) * (i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]));
        }
        sum += d * isum as f32 - dmin * msum as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::BlockQ8K;

    /// For each of llama.cpp's four 64-value steps: which of the eight i16
    /// scales each i16 lane of the low and high nibbles' products takes.
    static SHUFFLE: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 8 {
            let mut k = 0;
            while k < 32 {
                t[i * 32 + k] = (2 * i + (k % 2)) as u8;
                k += 1;
            }
            i += 1;
        }
        t
    };

    /// For the 512-bit kernel's low and high nibbles of its two steps:
    /// the block (scale index) of each i16 lane (16 lanes a block of 32).
    static LANE_SCALES: [[i16; 32]; 4] = {
        let blocks = [[0, 2], [1, 3], [4, 6], [5, 7]];
        let mut t = [[0i16; 32]; 4];
        let mut s = 0;
        while s < 4 {
            let mut l = 0;
            while l < 32 {
                t[s][l] = blocks[s][l / 16];
                l += 1;
            }
            s += 1;
        }
        t
    };

    /// The 12 scale bytes as eight 6-bit scales (low 8 bytes) and eight
    /// minimums (high 8 bytes), each widened to i16.
    #[inline(always)]
    unsafe fn scales_and_mins(b: &[u8]) -> __m256i {
        let (km1, km2, km3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        let mut u = [0u32; 4];
        for (k, word) in u.iter_mut().take(3).enumerate() {
            *word = u32::from_le_bytes([b[4 + 4 * k], b[5 + 4 * k], b[6 + 4 * k], b[7 + 4 * k]]);
        }
        u[3] = ((u[2] >> 4) & km2) | (((u[1] >> 6) & km3) << 4);
        let uaux = u[1] & km1;
        u[1] = (u[2] & km2) | (((u[0] >> 6) & km3) << 4);
        u[2] = uaux;
        u[0] &= km1;
        _mm256_cvtepu8_epi16(_mm_set_epi32(
            u[3] as i32,
            u[2] as i32,
            u[1] as i32,
            u[0] as i32,
        ))
    }

    /// d·y.d and −dmin·y.d of a block.
    #[inline(always)]
    unsafe fn factors(b: &[u8], y: &BlockQ8K) -> (f32, f32) {
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
            b[0], b[1], b[2], b[3],
        ])));
        (
            y.d * _mm_cvtss_f32(dd),
            -y.d * _mm_cvtss_f32(_mm_movehdup_ps(dd)),
        )
    }

    /// Σ minimum·(sums of the activations over its 32): the minimums' term.
    #[inline(always)]
    unsafe fn minimums(ms: __m256i, y: &BlockQ8K) -> __m128i {
        let q8sums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let q8s = _mm_hadd_epi16(
            _mm256_extracti128_si256(q8sums, 0),
            _mm256_extracti128_si256(q8sums, 1),
        );
        _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s)
    }

    #[inline(always)]
    unsafe fn hsum128(v: __m128) -> f32 {
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }

    /// llama.cpp's AVX2 kernel.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_avx2(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (b, y) in w.chunks_exact(144).zip(a) {
            let (d, dmin) = factors(b, y);
            let ms = scales_and_mins(b);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(minimums(ms, y)), acc_m);
            let sc128 = _mm256_extracti128_si256(ms, 0);
            let scales = _mm256_set_m128i(sc128, sc128);
            let mut sumi = _mm256_setzero_si256();
            let (q4, q8) = (b.as_ptr().add(16), y.qs.as_ptr());
            for j in 0..4 {
                let shuffle = SHUFFLE.as_ptr().add(64 * j) as *const __m256i;
                let scale_l = _mm256_shuffle_epi8(scales, _mm256_loadu_si256(shuffle));
                let scale_h = _mm256_shuffle_epi8(scales, _mm256_loadu_si256(shuffle.add(1)));
                let q4bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                let q8l = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
                let q8h = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
                let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        let halves = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        hsum128(halves) + hsum128(acc_m)
    }

    /// The same over 512-bit registers: each step takes 128 values (the
    /// low nibbles of blocks 4k and 4k + 2, the high ones of 4k + 1 and
    /// 4k + 3), 1.2× llama.cpp's AVX2 kernel's speed here.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub unsafe fn dot_avx512(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let m4 = _mm512_set1_epi8(0xF);
        let idx = [
            _mm512_loadu_si512(LANE_SCALES[0].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[1].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[2].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[3].as_ptr() as *const _),
        ];
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (b, y) in w.chunks_exact(144).zip(a) {
            let (d, dmin) = factors(b, y);
            let ms = scales_and_mins(b);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(minimums(ms, y)), acc_m);
            let scales = _mm512_castsi128_si512(_mm256_extracti128_si256(ms, 0));
            let mut sumi = _mm512_setzero_si512();
            let (q4, q8) = (b.as_ptr().add(16), y.qx.as_ptr());
            for k in 0..2 {
                let q4bits = _mm512_loadu_si512(q4.add(64 * k) as *const _);
                let q4l = _mm512_and_si512(q4bits, m4);
                let q4h = _mm512_and_si512(_mm512_srli_epi16(q4bits, 4), m4);
                let q8l = _mm512_loadu_si512(q8.add(128 * k) as *const _);
                let q8h = _mm512_loadu_si512(q8.add(128 * k + 64) as *const _);
                let sl = _mm512_permutexvar_epi16(idx[2 * k], scales);
                let sh = _mm512_permutexvar_epi16(idx[2 * k + 1], scales);
                let pl = _mm512_madd_epi16(sl, _mm512_maddubs_epi16(q4l, q8l));
                let ph = _mm512_madd_epi16(sh, _mm512_maddubs_epi16(q4h, q8h));
                sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(pl, ph));
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        _mm512_reduce_add_ps(acc) + hsum128(acc_m)
    }

    /// [`dot_avx512`] of one weight row against `R` activation rows at
    /// once: each block's scales, nibbles and lane factors are unpacked
    /// once for all of them (a prompt's rows: 2x the speed of one row at a
    /// time).
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub unsafe fn dot_rows_avx512<const R: usize>(w: &[u8], a: [&[BlockQ8K]; R]) -> [f32; R] {
        let m4 = _mm512_set1_epi8(0xF);
        let idx = [
            _mm512_loadu_si512(LANE_SCALES[0].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[1].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[2].as_ptr() as *const _),
            _mm512_loadu_si512(LANE_SCALES[3].as_ptr() as *const _),
        ];
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acc_m = [_mm_setzero_ps(); R];
        for (i, b) in w.chunks_exact(144).enumerate() {
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
                b[0], b[1], b[2], b[3],
            ])));
            let (dw, dminw) = (_mm_cvtss_f32(dd), -_mm_cvtss_f32(_mm_movehdup_ps(dd)));
            let ms = scales_and_mins(b);
            let scales = _mm512_castsi128_si512(_mm256_extracti128_si256(ms, 0));
            let q4 = b.as_ptr().add(16);
            let mut q4l = [_mm512_setzero_si512(); 2];
            let mut q4h = [_mm512_setzero_si512(); 2];
            let mut sl = [_mm512_setzero_si512(); 2];
            let mut sh = [_mm512_setzero_si512(); 2];
            for k in 0..2 {
                let q4bits = _mm512_loadu_si512(q4.add(64 * k) as *const _);
                q4l[k] = _mm512_and_si512(q4bits, m4);
                q4h[k] = _mm512_and_si512(_mm512_srli_epi16(q4bits, 4), m4);
                sl[k] = _mm512_permutexvar_epi16(idx[2 * k], scales);
                sh[k] = _mm512_permutexvar_epi16(idx[2 * k + 1], scales);
            }
            for r in 0..R {
                let y = &a[r][i];
                let mins = minimums(ms, y);
                acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dminw * y.d), _mm_cvtepi32_ps(mins), acc_m[r]);
                let q8 = y.qx.as_ptr();
                let mut sumi = _mm512_setzero_si512();
                for k in 0..2 {
                    let q8l = _mm512_loadu_si512(q8.add(128 * k) as *const _);
                    let q8h = _mm512_loadu_si512(q8.add(128 * k + 64) as *const _);
                    let pl = _mm512_madd_epi16(sl[k], _mm512_maddubs_epi16(q4l[k], q8l));
                    let ph = _mm512_madd_epi16(sh[k], _mm512_maddubs_epi16(q4h[k], q8h));
                    sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(pl, ph));
                }
                acc[r] =
                    _mm512_fmadd_ps(_mm512_set1_ps(dw * y.d), _mm512_cvtepi32_ps(sumi), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]) + hsum128(acc_m[r]);
        }
        out
    }
}

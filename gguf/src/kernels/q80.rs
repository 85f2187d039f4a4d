//! Q8_0 weights against Q8_0 activations (llama.cpp's
//! `ggml_vec_dot_q8_0_q8_0`, and `quantize_row_q8_0` for the
//! activations). A block (34 bytes, 32 weights): float16 d, 32 int8.

use super::{f16_at, Simd};

/// 32 activations as 8-bit integers with a float16 factor (llama.cpp's
/// `block_q8_0`; the factor kept as the float16's value).
#[derive(Clone, Copy)]
pub struct BlockQ80 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// `x` (whole blocks of 32) as llama.cpp's CPU backend quantizes
/// activations for Q8_0: d = max|x| / 127 stored as float16, each value
/// x · 127 / max|x| rounded to the nearest (ties to even).
pub fn quantize(x: &[f32]) -> Vec<BlockQ80> {
    x.chunks_exact(32)
        .map(|xb| {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = half::f16::from_f32(amax / 127.0).to_f32();
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut qs = [0i8; 32];
            for (q, &v) in qs.iter_mut().zip(xb) {
                *q = (v * id).round_ties_even() as i8;
            }
            BlockQ80 { d, qs }
        })
        .collect()
}

pub fn dot(w: &[u8], a: &[BlockQ80], simd: Simd) -> f32 {
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 => unsafe { x86::dot_avx2(w, a) },
        _ => dot_portable(w, a),
    }
}

pub fn dot_portable(w: &[u8], a: &[BlockQ80]) -> f32 {
    w.chunks_exact(34)
        .zip(a)
        .map(|(b, y)| {
            let sumi: i32 = b[2..34]
                .iter()
                .zip(&y.qs)
                .map(|(&q, &v)| i32::from(q as i8) * i32::from(v))
                .sum();
            sumi as f32 * (f16_at(b, 0) * y.d)
        })
        .sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::BlockQ80;

    /// llama.cpp's AVX2 kernel (`mul_sum_i8_pairs_float`: the signs moved
    /// onto the activations so the weights' magnitudes are unsigned).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_avx2(w: &[u8], a: &[BlockQ80]) -> f32 {
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for (b, y) in w.chunks_exact(34).zip(a) {
            let dx = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                u16::from_le_bytes([b[0], b[1]]),
            ))));
            let d = _mm256_set1_ps(dx * y.d);
            let qx = _mm256_loadu_si256(b.as_ptr().add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            let ax = _mm256_sign_epi8(qx, qx);
            let sy = _mm256_sign_epi8(qy, qx);
            let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc);
        }
        let v = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }
}

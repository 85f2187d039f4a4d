//! Q6_K weights against Q8_K activations (llama.cpp's
//! `ggml_vec_dot_q6_K_q8_K`). A Q6_K super-block (210 bytes, 256 weights):
//! 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one
//! a block of 16), float16 d; weight = d·sc·(q − 32).

use super::q4k::BlockQ8K;
use super::{f16_at, Simd};

pub fn dot(w: &[u8], a: &[BlockQ8K], simd: Simd) -> f32 {
    match simd {
        // SAFETY: the CPU has the features (checked once, `super::simd`).
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 | Simd::Avx2 => unsafe { x86::dot_avx2(w, a) },
        _ => dot_portable(w, a),
    }
}

/// Value i (0..256) of a block: its nibble from byte 64n + l (+ 32 for
/// odd k; the high nibble for k ≥ 2), its high bits 2k of byte 32n + l,
/// for i = 128n + 32k + l.
fn value(b: &[u8], i: usize) -> i32 {
    let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
    let byte = b[64 * n + l + 32 * (k % 2)];
    let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
    let high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    i32::from(low | (high << 4)) - 32
}

pub fn dot_portable(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let mut isum = 0i32;
        for j in 0..16 {
            let scale = i32::from(b[192 + j] as i8);
            let dot: i32 = (16 * j..16 * j + 16)
                .map(|i| value(b, i) * i32::from(y.qs[i]))
                .sum();
            isum += scale * dot;
        }
        sum += f16_at(b, 208) * y.d * isum as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::BlockQ8K;

    /// For step i: scale 2i over 8 lanes, then scale 2i + 1.
    static SHUFFLE: [u8; 128] = {
        let mut t = [0u8; 128];
        let mut i = 0;
        while i < 128 {
            t[i] = (i / 8) as u8;
            i += 1;
        }
        t
    };

    /// llama.cpp's AVX2 kernel: the values taken unsigned (0..63) and the
    /// 32 they are off by taken back as 32·Σ scale·(sums of 16
    /// activations).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_avx2(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut acc = _mm256_setzero_ps();
        // The float16 by table (see `legacy`'s `half`: F16C here chains the
        // blocks through the running sum).
        let table = super::super::f16_table();
        for (b, y) in w.chunks_exact(210).zip(a) {
            let dx = table[usize::from(u16::from_le_bytes([b[208], b[209]]))];
            let d = y.d * dx;
            let q8sums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let scales = _mm_loadu_si128(b.as_ptr().add(192) as *const __m128i);
            let scales_16 = _mm256_cvtepi8_epi16(scales);
            let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            let mut sumi = _mm256_setzero_si256();
            let (mut q4, mut qh, mut q8) = (b.as_ptr(), b.as_ptr().add(128), y.qs.as_ptr());
            for j in 0..2 {
                let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
                let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
                let q4bits_h = _mm256_loadu_si256(qh as *const __m256i);
                q4 = q4.add(64);
                qh = qh.add(32);
                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                let q4_2 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                let q4_3 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
                let mut p = [q4_0, q4_1, q4_2, q4_3];
                for (k, pk) in p.iter_mut().enumerate() {
                    let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                    let shuffle =
                        _mm_loadu_si128(SHUFFLE.as_ptr().add(16 * (4 * j + k)) as *const __m128i);
                    let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle));
                    *pk = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(*pk, q8k));
                }
                q8 = q8.add(128);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
            }
            sumi = _mm256_sub_epi32(sumi, q8sclsub);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        let v = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }
}

//! Q8_0 weights against Q8_0 activations (llama.cpp's
//! `ggml_vec_dot_q8_0_q8_0`, and `quantize_row_q8_0` for the
//! activations; the SIMD kernel is the 32-weight types' in `legacy`). A
//! block (34 bytes, 32 weights): float16 d, 32 int8.

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
                *q = super::nearest_int(v * id) as i8;
            }
            BlockQ80 { d, qs }
        })
        .collect()
}

pub fn dot(w: &[u8], a: &[BlockQ80], simd: Simd) -> f32 {
    super::legacy::dot_q8_0(w, a, super::legacy::Q8_0, simd)
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

//! Each decoder against a transliteration of ggml's reference
//! dequantization (ggml-quants.c, dequantize_row_*) on random blocks.

use super::*;

fn f16v(bytes: &[u8], at: usize) -> f32 {
    f16(half_at(bytes, at))
}

/// ggml's dequantize_row_* for one block of each type.
fn reference(ty: GgmlType, b: &[u8], y: &mut Vec<f32>) {
    match ty {
        GgmlType::Q4_0 => {
            let d = f16v(b, 0);
            let (lo, hi): (Vec<f32>, Vec<f32>) = (0..16)
                .map(|j| {
                    let q = b[2 + j];
                    (((q & 15) as f32 - 8.0) * d, ((q >> 4) as f32 - 8.0) * d)
                })
                .unzip();
            y.extend(lo);
            y.extend(hi);
        }
        GgmlType::Q4_1 => {
            let (d, m) = (f16v(b, 0), f16v(b, 2));
            let (lo, hi): (Vec<f32>, Vec<f32>) = (0..16)
                .map(|j| {
                    let q = b[4 + j];
                    ((q & 15) as f32 * d + m, (q >> 4) as f32 * d + m)
                })
                .unzip();
            y.extend(lo);
            y.extend(hi);
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let one = ty == GgmlType::Q5_1;
            let d = f16v(b, 0);
            let m = if one { f16v(b, 2) } else { 0.0 };
            let o = if one { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            let qs = &b[o + 4..o + 20];
            let mut out = [0f32; 32];
            for j in 0..16 {
                let xh0 = (((qh >> j) << 4) & 0x10) as i32;
                let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
                let (x0, x1) = ((qs[j] & 0x0F) as i32 | xh0, (qs[j] >> 4) as i32 | xh1);
                let bias = if one { 0 } else { 16 };
                out[j] = (x0 - bias) as f32 * d + m;
                out[j + 16] = (x1 - bias) as f32 * d + m;
            }
            y.extend(out);
        }
        GgmlType::Q8_0 => {
            let d = f16v(b, 0);
            y.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
        }
        GgmlType::Q2_K => {
            let (d, min) = (f16v(b, 80), f16v(b, 82));
            let mut q = 16;
            let mut is = 0;
            for _ in 0..2 {
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let sc = b[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                        for l in 0..16 {
                            let v = (b[q + l + 16 * half] >> shift) & 3;
                            y.push(dl * v as f32 - ml);
                        }
                    }
                }
                q += 32;
            }
        }
        GgmlType::Q3_K => {
            let d_all = f16v(b, 108);
            let word = |k: usize| u32::from_le_bytes([b[96 + k], b[97 + k], b[98 + k], b[99 + k]]);
            let (mut aux, tmp) = ([word(0), word(4), word(8), 0], word(8));
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
            aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
            aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
            aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
            let scales: Vec<i8> = aux
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|x| x as i8)
                .collect();
            let (mut q, mut m, mut is) = (32usize, 1u8, 0);
            for _ in 0..2 {
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let dl = d_all * (scales[is] as f32 - 32.0);
                        is += 1;
                        for l in 16 * half..16 * half + 16 {
                            let low = ((b[q + l] >> shift) & 3) as i32;
                            let sub = if b[l] & m != 0 { 0 } else { 4 };
                            y.push(dl * (low - sub) as f32);
                        }
                    }
                    m <<= 1;
                }
                q += 32;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let five = ty == GgmlType::Q5_K;
            let (d, min) = (f16v(b, 0), f16v(b, 2));
            // ggml's get_scale_min_k4.
            let q = &b[4..16];
            let scale_min = |j: usize| -> (f32, f32) {
                if j < 4 {
                    ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
                } else {
                    (
                        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f32,
                        ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f32,
                    )
                }
            };
            let (qh, mut ql) = (&b[16..48], if five { 48 } else { 16 });
            let (mut u1, mut u2) = (1u8, 2u8);
            for j in (0..8).step_by(2) {
                let ((sc1, mn1), (sc2, mn2)) = (scale_min(j), scale_min(j + 1));
                let (d1, m1) = (d * sc1, min * mn1);
                let (d2, m2) = (d * sc2, min * mn2);
                for l in 0..32 {
                    let h = if five && qh[l] & u1 != 0 { 16.0 } else { 0.0 };
                    y.push(d1 * ((b[ql + l] & 0xF) as f32 + h) - m1);
                }
                for l in 0..32 {
                    let h = if five && qh[l] & u2 != 0 { 16.0 } else { 0.0 };
                    y.push(d2 * ((b[ql + l] >> 4) as f32 + h) - m2);
                }
                ql += 32;
                u1 <<= 2;
                u2 <<= 2;
            }
        }
        GgmlType::Q6_K => {
            let d = f16v(b, 208);
            let mut out = [0f32; 256];
            for n in 0..2 {
                let (ql, qh, sc) = (64 * n, 128 + 32 * n, 192 + 8 * n);
                for l in 0..32 {
                    let is = l / 16;
                    let q = |lo: u8, hi: u8| (lo as i32 | ((hi as i32) << 4)) - 32;
                    let q1 = q(b[ql + l] & 0xF, b[qh + l] & 3);
                    let q2 = q(b[ql + l + 32] & 0xF, (b[qh + l] >> 2) & 3);
                    let q3 = q(b[ql + l] >> 4, (b[qh + l] >> 4) & 3);
                    let q4 = q(b[ql + l + 32] >> 4, (b[qh + l] >> 6) & 3);
                    let s = |k: usize| d * (b[sc + is + k] as i8) as f32;
                    out[128 * n + l] = s(0) * q1 as f32;
                    out[128 * n + l + 32] = s(2) * q2 as f32;
                    out[128 * n + l + 64] = s(4) * q3 as f32;
                    out[128 * n + l + 96] = s(6) * q4 as f32;
                }
            }
            y.extend(out);
        }
        _ => unreachable!(),
    }
}

/// Random blocks of `ty` whose float16 fields are ordinary numbers.
fn random_blocks(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
    let (_, size) = ty.block().unwrap();
    let mut state = seed;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut bytes: Vec<u8> = (0..blocks * size as usize).map(|_| next() as u8).collect();
    let halves: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    let halves: Vec<usize> = if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
        vec![0, 2]
    } else {
        halves.to_vec()
    };
    for block in bytes.chunks_exact_mut(size as usize) {
        for &at in &halves {
            let v = half::f16::from_f32((next() % 2000) as f32 / 1000.0 - 1.0);
            block[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    bytes
}

#[test]
fn every_type_decodes_as_ggml_dequantizes() {
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    let (rows, cols) = (3, 512);
    for (k, ty) in types.into_iter().enumerate() {
        let (block, _) = ty.block().unwrap();
        let blocks = rows * cols / block as usize;
        let bytes = random_blocks(ty, blocks, 17 + k as u64);
        let Weight::Packed(p) = weight(ty, &bytes, rows, cols).unwrap() else {
            panic!("{ty} is not packed")
        };
        let (_, size) = ty.block().unwrap();
        let mut want = Vec::new();
        for b in bytes.chunks_exact(size as usize) {
            reference(ty, b, &mut want);
        }
        let got = p.dequantize();
        assert_eq!(got.len(), want.len(), "{ty}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-6 * w.abs().max(1.0);
            assert!((g - w).abs() <= tol, "{ty} weight {i}: {g} vs ggml {w}");
        }
        assert_eq!(p.blobs.len(), rows * cols * p.bits as usize / 8, "{ty}");
    }
}

#[test]
fn float_matrices_are_transposed_in_their_type() {
    let bytes: Vec<u8> = (0..2 * 3 * 2).map(|i| i as u8).collect();
    let Weight::Dense(d) = weight(GgmlType::F16, &bytes, 2, 3).unwrap() else {
        panic!()
    };
    // Rows [e0 e1 e2] [e3 e4 e5] -> columns [e0 e3] [e1 e4] [e2 e5].
    assert_eq!(d.data, vec![0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
    assert_eq!(d.elem, ElemType::FLOAT16);
}

#[test]
fn stacking_keeps_rows_in_order_and_refuses_mixed_forms() {
    let a = random_blocks(GgmlType::Q4_K, 2, 1);
    let b = random_blocks(GgmlType::Q4_K, 2, 2);
    let (Weight::Packed(pa), Weight::Packed(pb)) = (
        weight(GgmlType::Q4_K, &a, 1, 512).unwrap(),
        weight(GgmlType::Q4_K, &b, 1, 512).unwrap(),
    ) else {
        panic!()
    };
    let both = Packed::stack(&[&pa, &pb]).unwrap();
    let mut want = pa.dequantize();
    want.extend(pb.dequantize());
    assert_eq!(both.dequantize(), want);
    let c = random_blocks(GgmlType::Q6_K, 2, 3);
    let Weight::Packed(pc) = weight(GgmlType::Q6_K, &c, 1, 512).unwrap() else {
        panic!()
    };
    assert!(Packed::stack(&[&pa, &pc]).is_none());
}

#[test]
fn wrong_lengths_and_unread_types_are_errors() {
    assert!(matches!(
        weight(GgmlType::Q4_0, &[0u8; 17], 1, 32),
        Err(QuantError::Length { .. })
    ));
    let e = weight(GgmlType(23), &[0u8; 136], 1, 256).unwrap_err();
    assert!(e.to_string().contains("IQ4_XS"), "{e}");
}

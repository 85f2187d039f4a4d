//! Each kernel against the dequantized weights and activations in
//! float64, and the SIMD kernels against the portable ones.

use super::*;

/// Random blocks of `ty` whose float16 fields are small ordinary numbers.
fn random_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let (block, size) = ty.block().unwrap();
    let mut state = seed;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut bytes: Vec<u8> = (0..rows * cols / block as usize * size as usize)
        .map(|_| next() as u8)
        .collect();
    let halves: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for b in bytes.chunks_exact_mut(size as usize) {
        for &at in halves {
            let v = half::f16::from_f32((next() % 1000) as f32 / 50_000.0 + 0.001);
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

fn activations(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1 << 24) as f32
                - 0.5)
                * 4.0
        })
        .collect()
}

/// The activations as the kernel quantized them, back in float.
fn dequantized(ty: GgmlType, x: &[f32]) -> Vec<f64> {
    match quantize(ty, x) {
        Activations::K(blocks) => blocks
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f64::from(q) * f64::from(b.d)))
            .collect(),
        Activations::Q8(blocks) => blocks
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f64::from(q) * f64::from(b.d)))
            .collect(),
        Activations::Q81(blocks) => blocks
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f64::from(q) * f64::from(b.d)))
            .collect(),
    }
}

#[test]
fn every_kernel_computes_the_dequantized_product() {
    let (rows, cols) = (37, 1024);
    for (k, &ty) in KERNEL_TYPES.iter().enumerate() {
        let bytes = random_blocks(ty, rows, cols, 11 + k as u64);
        let w = Blocks::new(ty, rows, cols, &bytes).unwrap();
        // Six rows: a group of four (one kernel call for four rows where
        // the CPU has it) and two alone.
        let m_rows = 6;
        let x = activations(m_rows * cols, 5);
        let mut y = vec![0f32; m_rows * rows];
        matmul(&w, &x, &mut y, &serial).unwrap();
        let crate::quant::Weight::Packed(p) = crate::quant::weight(ty, &bytes, rows, cols).unwrap()
        else {
            panic!()
        };
        let weights = p.dequantize();
        for m in 0..m_rows {
            let a = dequantized(ty, &x[m * cols..(m + 1) * cols]);
            for r in 0..rows {
                let want: f64 = (0..cols)
                    .map(|c| f64::from(weights[r * cols + c]) * a[c])
                    .sum();
                let got = f64::from(y[m * rows + r]);
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{ty} row {m},{r}: {got} vs {want}"
                );
            }
        }
        // Every SIMD level this CPU has gives the portable kernel's sums,
        // up to float32 rounding (llama.cpp's Q6_K kernel takes the values
        // unsigned and subtracts 32 × the activations' sums: partial sums
        // that cancel).
        for level in [Simd::Avx512, Simd::Avx2] {
            if level == Simd::Avx512 && simd() != Simd::Avx512 || simd() == Simd::Portable {
                continue;
            }
            let a = quantize(ty, &x[..cols]);
            for r in 0..rows {
                let (fast, portable) = (
                    dot(ty, w.row(r), &a, level),
                    dot(ty, w.row(r), &a, Simd::Portable),
                );
                assert!(
                    (fast - portable).abs() <= 1e-4 * portable.abs().max(1.0),
                    "{ty} {level:?} row {r}: {fast} vs {portable}"
                );
            }
        }
    }
}

#[test]
fn activations_are_quantized_as_llama_cpp_does() {
    // Q8_K: factor max / -127 of the value of largest magnitude (here
    // -127: factor 1), ties to even (1.5 -> 2, 2.5 -> 2).
    let mut x = vec![0f32; 256];
    x[0] = -127.0;
    x[1] = 2.5;
    x[2] = 1.5;
    let Activations::K(k) = quantize(GgmlType::Q4_K, &x) else {
        panic!()
    };
    assert_eq!(
        (k[0].d, k[0].qs[0], k[0].qs[1], k[0].qs[2]),
        (1.0, -127, 2, 2)
    );
    assert_eq!(k[0].bsums[0], -127 + 4);
    let Activations::Q8(q) = quantize(GgmlType::Q8_0, &x[..32]) else {
        panic!()
    };
    assert_eq!((q[0].qs[0], q[0].qs[1], q[0].qs[2]), (-127, 2, 2));
}

#[test]
fn gather_dequantizes_rows_and_refuses_indices_outside() {
    let (rows, cols) = (5, 256);
    let bytes = random_blocks(GgmlType::Q6_K, rows, cols, 3);
    let w = Blocks::new(GgmlType::Q6_K, rows, cols, &bytes).unwrap();
    let mut y = vec![0f32; 2 * cols];
    gather(&w, &[4, 1], &mut y).unwrap();
    let crate::quant::Weight::Packed(p) =
        crate::quant::weight(GgmlType::Q6_K, &bytes, rows, cols).unwrap()
    else {
        panic!()
    };
    let all = p.dequantize();
    assert_eq!(&y[..cols], &all[4 * cols..5 * cols]);
    assert_eq!(&y[cols..], &all[cols..2 * cols]);
    assert_eq!(
        gather(&w, &[5], &mut y[..cols]),
        Err(KernelError::Index { index: 5, rows })
    );
    assert!(Blocks::new(GgmlType::Q6_K, rows, cols, &bytes[1..]).is_err());
}

#[test]
fn experts_products_are_each_token_s_chosen_experts_plain_products() {
    let (experts, n, cols, slots) = (4, 20, 256, 2);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let bytes = random_blocks(ty, experts * n, cols, 21);
        let w = Blocks::new(ty, experts * n, cols, &bytes).unwrap();
        // Six tokens (a group of four and two alone for expert 1), each
        // sent to two experts.
        let ids: Vec<i64> = vec![1, 3, 1, 0, 1, 2, 1, 3, 1, 0, 3, 2];
        let tokens = ids.len() / slots;
        let x = activations(tokens * cols, 9);
        let mut y = vec![0f32; ids.len() * n];
        let input = ExpertInput {
            x: &x,
            ids: &ids,
            slots,
            per_slot: false,
        };
        matmul_experts(&w, experts, &input, &mut y, &serial).unwrap();
        // Each (token, slot) row: that token times its expert's rows.
        for (i, &e) in ids.iter().enumerate() {
            let e = e as usize;
            let block = &bytes[e * n * w.row_bytes..(e + 1) * n * w.row_bytes];
            let expert = Blocks::new(ty, n, cols, block).unwrap();
            let t = i / slots;
            let mut want = vec![0f32; n];
            matmul(&expert, &x[t * cols..(t + 1) * cols], &mut want, &serial).unwrap();
            assert_eq!(&y[i * n..(i + 1) * n], &want[..], "{ty} row {i}");
        }
        // One row a token and slot (the down product's input).
        let x2 = activations(ids.len() * cols, 13);
        let input = ExpertInput {
            x: &x2,
            ids: &ids,
            slots,
            per_slot: true,
        };
        matmul_experts(&w, experts, &input, &mut y, &serial).unwrap();
        let e = ids[5] as usize;
        let block = &bytes[e * n * w.row_bytes..(e + 1) * n * w.row_bytes];
        let mut want = vec![0f32; n];
        let expert = Blocks::new(ty, n, cols, block).unwrap();
        matmul(&expert, &x2[5 * cols..6 * cols], &mut want, &serial).unwrap();
        assert_eq!(&y[5 * n..6 * n], &want[..], "{ty} per slot");
        // An id outside the experts is refused.
        let bad = [0, 4];
        let input = ExpertInput {
            x: &x[..cols],
            ids: &bad,
            slots,
            per_slot: false,
        };
        assert_eq!(
            matmul_experts(&w, experts, &input, &mut y[..2 * n], &serial),
            Err(KernelError::Index { index: 4, rows: 4 })
        );
    }
}

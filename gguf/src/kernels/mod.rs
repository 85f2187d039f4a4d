//! llama.cpp's matrix products over its own blocks, as the worker's
//! onnxruntime plugin runs them (custom operators of the
//! [`DOMAIN`] domain: `MatMul`, `Gather`).
//!
//! onnxruntime's `MatMulNBits` takes a K-quant as 4-bit values and a
//! float32 factor per block of 32, plus a product of its own for the
//! minimums: 6 bits a weight read per token where the file has 4.5, and
//! its kernels' per-block work, so a decode step of a Q4_K model ran at
//! 0.72 of llama.cpp's speed on one thread. These kernels read the file's
//! blocks as they are and compute as llama.cpp's CPU backend does: each
//! activation row quantized to 8 bits (Q8_K blocks of 256 for the
//! K-quants, Q8_0 blocks of 32 for Q8_0, with llama.cpp's rounding), then
//! integer dot products per block scaled in float32. Their results are
//! llama.cpp's up to the order of float32 sums.
//!
//! Kernels: Q4_K (AVX-512BW, AVX2, portable), Q6_K, Q8_0, Q4_0, Q4_1,
//! Q5_0 and Q5_1 (AVX2, portable), chosen once by what the CPU has. Other
//! types (Q2_K, Q3_K, Q5_K) stay `MatMulNBits` (`crate::quant`).

mod experts;
mod legacy;
mod q4k;
mod q6k;
mod q80;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::quant;
use crate::types::GgmlType;

pub use tessera_common::ops::GGML_DOMAIN as DOMAIN;
/// The product `y = x · Wᵀ` over a matrix of blocks (attributes `type`,
/// `K`, `N`; inputs `x` float `[.., K]`, the blocks uint8 `[N, bytes]`).
pub const MATMUL: &str = "MatMul";
/// Rows of a matrix of blocks, dequantized (attributes `type`, `K`;
/// inputs the blocks uint8 `[rows, bytes]`, indices int64).
pub const GATHER: &str = "Gather";
/// Each token's chosen experts' products, ggml's `mul_mat_id`
/// ([`matmul_experts`]; attributes `type`, `K`, `N`, `experts`).
pub const MATMUL_EXPERTS: &str = "MatMulExperts";

pub use experts::{matmul_experts, ExpertInput};

/// Whether weights of type `ty` have kernels.
pub fn has_kernel(ty: GgmlType) -> bool {
    KERNEL_TYPES.contains(&ty)
}

/// The types with kernels.
pub const KERNEL_TYPES: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Why a product cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("no kernel for weights of type {0}")]
    Type(String),
    #[error("{got} bytes of {ty} for [{rows}, {cols}] (want {want})")]
    Length {
        ty: String,
        rows: usize,
        cols: usize,
        got: usize,
        want: usize,
    },
    #[error("an input of {got} values is not rows of {cols}")]
    Input { got: usize, cols: usize },
    #[error("row {index} of a matrix of {rows}")]
    Index { index: i64, rows: usize },
    #[error("{0}")]
    Shape(String),
}

/// A matrix of ggml blocks: `rows` rows of `cols` values.
#[derive(Clone, Copy)]
pub struct Blocks<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    data: &'a [u8],
    row_bytes: usize,
}

impl<'a> Blocks<'a> {
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Blocks<'a>, KernelError> {
        let (block, size) = ty.block().ok_or_else(|| KernelError::Type(ty.name()))?;
        let (block, size) = (block as usize, size as usize);
        let length = |want| KernelError::Length {
            ty: ty.name(),
            rows,
            cols,
            got: data.len(),
            want,
        };
        if !cols.is_multiple_of(block) {
            return Err(length(0));
        }
        let row_bytes = cols / block * size;
        if data.len() != rows * row_bytes {
            return Err(length(rows * row_bytes));
        }
        Ok(Blocks {
            ty,
            rows,
            cols,
            data,
            row_bytes,
        })
    }

    fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// An activation row quantized as llama.cpp does for a weight type.
enum Activations {
    K(Vec<q4k::BlockQ8K>),
    Q8(Vec<q80::BlockQ80>),
    Q81(Vec<legacy::BlockQ81>),
}

fn quantize(ty: GgmlType, x: &[f32]) -> Activations {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => Activations::Q8(q80::quantize(x)),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Activations::Q81(legacy::quantize_q8_1(x)),
        _ => Activations::K(q4k::quantize_q8_k(x)),
    }
}

/// The SIMD the CPU has, found once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Simd {
    Avx512,
    Avx2,
    Portable,
}

pub(crate) fn simd() -> Simd {
    static SIMD: OnceLock<Simd> = OnceLock::new();
    *SIMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return Simd::Avx512;
            }
            if avx2 {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    })
}

/// Whether the CPU has AVX-512 VNNI (with VL: its 256-bit forms), found
/// once.
pub(crate) fn vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// One weight row against one quantized activation row.
fn dot(ty: GgmlType, row: &[u8], a: &Activations, simd: Simd) -> f32 {
    match (ty, a) {
        (GgmlType::Q4_K, Activations::K(a)) => q4k::dot(row, a, simd),
        (GgmlType::Q6_K, Activations::K(a)) => q6k::dot(row, a, simd),
        (GgmlType::Q8_0, Activations::Q8(a)) => q80::dot(row, a, simd),
        (GgmlType::Q4_0, Activations::Q8(a)) => legacy::dot_q8_0(row, a, legacy::Q4_0, simd),
        (GgmlType::Q5_0, Activations::Q8(a)) => legacy::dot_q8_0(row, a, legacy::Q5_0, simd),
        (GgmlType::Q4_1, Activations::Q81(a)) => legacy::dot_q8_1(row, a, legacy::Q4_1, simd),
        (GgmlType::Q5_1, Activations::Q81(a)) => legacy::dot_q8_1(row, a, legacy::Q5_1, simd),
        _ => unreachable!("activations are quantized for their weight's type"),
    }
}

/// Weight rows a job of [`matmul`] takes: small enough for their blocks
/// to stay in cache while every activation row passes over them.
const ROWS_PER_JOB: usize = 16;

/// Runs `jobs` jobs, each `job(index)`, on whatever threads it has.
pub type Parallel<'a> = &'a dyn Fn(usize, &(dyn Fn(usize) + Sync));

/// `y = x · Wᵀ`: `x` is rows of `w.cols` values, `y` (rows of `w.rows`)
/// is written whole. `parallel` spreads jobs of `ROWS_PER_JOB` weight
/// rows over threads (or runs them in turn).
pub fn matmul(
    w: &Blocks<'_>,
    x: &[f32],
    y: &mut [f32],
    parallel: Parallel<'_>,
) -> Result<(), KernelError> {
    if !has_kernel(w.ty) {
        return Err(KernelError::Type(w.ty.name()));
    }
    if w.cols == 0 || !x.len().is_multiple_of(w.cols) || y.len() != x.len() / w.cols * w.rows {
        return Err(KernelError::Input {
            got: x.len(),
            cols: w.cols,
        });
    }
    let m = x.len() / w.cols;
    let activations: Vec<Activations> = x
        .chunks_exact(w.cols)
        .map(|row| quantize(w.ty, row))
        .collect();
    let acts: Vec<&Activations> = activations.iter().collect();
    let simd = simd();
    let out = SharedOut(y.as_mut_ptr());
    let n = w.rows;
    let groups = row_groups(w.ty, &acts, simd);
    let job = |j: usize| {
        let rows = j * ROWS_PER_JOB..((j + 1) * ROWS_PER_JOB).min(n);
        // SAFETY: job j alone writes columns `rows` of each row of y, which
        // holds m × n values.
        let write = |i: usize, r: usize, v: f32| unsafe { out.write(i * n + r, v) };
        products(w, (0, rows), (&acts, &groups), simd, &write);
    };
    debug_assert_eq!(y.len(), m * n);
    parallel(n.div_ceil(ROWS_PER_JOB), &job);
    Ok(())
}

/// Activation rows in groups of [`q4k::ROWS_AT_ONCE`].
type Groups<'a> = Vec<[&'a [q4k::BlockQ8K]; q4k::ROWS_AT_ONCE]>;

/// Weight rows `base + rows` against every activation row: the groups a
/// weight row meets at once first, the rest one at a time; `write(i, r,
/// v)` takes activation row i's product with weight row `base + r`.
fn products(
    w: &Blocks<'_>,
    (base, rows): (usize, std::ops::Range<usize>),
    (acts, groups): (&[&Activations], &Groups<'_>),
    simd: Simd,
    write: &dyn Fn(usize, usize, f32),
) {
    let mut done = 0;
    for (g, group) in groups.iter().enumerate() {
        for r in rows.clone() {
            if let Some(v) = q4k::dot_rows(w.row(base + r), *group, simd) {
                v.iter()
                    .enumerate()
                    .for_each(|(k, &v)| write(g * q4k::ROWS_AT_ONCE + k, r, v));
            }
        }
        done = (g + 1) * q4k::ROWS_AT_ONCE;
    }
    for (i, a) in acts.iter().enumerate().skip(done) {
        for r in rows.clone() {
            write(i, r, dot(w.ty, w.row(base + r), a, simd));
        }
    }
}

/// Activation rows in groups a weight row meets at once, where the type
/// and CPU have such a kernel (Q4_K, AVX-512); the rest one at a time.
fn row_groups<'a>(ty: GgmlType, acts: &[&'a Activations], simd: Simd) -> Groups<'a> {
    if ty != GgmlType::Q4_K || simd != Simd::Avx512 {
        return Vec::new();
    }
    let rows: Vec<&[q4k::BlockQ8K]> = acts
        .iter()
        .filter_map(|a| match a {
            Activations::K(k) => Some(k.as_slice()),
            Activations::Q8(_) | Activations::Q81(_) => None,
        })
        .collect();
    rows.chunks_exact(q4k::ROWS_AT_ONCE)
        .filter_map(|c| c.try_into().ok())
        .collect()
}

/// `y`'s buffer, written by jobs at disjoint indices.
struct SharedOut(*mut f32);

// SAFETY: jobs write disjoint indices of a buffer that outlives them.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `at` is within the buffer and no other job writes it.
    unsafe fn write(&self, at: usize, v: f32) {
        unsafe { *self.0.add(at) = v };
    }
}

/// Runs jobs one after another (one thread).
pub fn serial(jobs: usize, job: &(dyn Fn(usize) + Sync)) {
    (0..jobs).for_each(job);
}

/// The rows `indices` of `w`, dequantized, into `y` (`indices.len() ×
/// w.cols` values).
pub fn gather(w: &Blocks<'_>, indices: &[i64], y: &mut [f32]) -> Result<(), KernelError> {
    if y.len() != indices.len() * w.cols {
        return Err(KernelError::Input {
            got: y.len(),
            cols: w.cols,
        });
    }
    for (&index, out) in indices.iter().zip(y.chunks_exact_mut(w.cols)) {
        let r = usize::try_from(index)
            .ok()
            .filter(|&r| r < w.rows)
            .ok_or(KernelError::Index {
                index,
                rows: w.rows,
            })?;
        let row =
            quant::weight(w.ty, w.row(r), 1, w.cols).map_err(|_| KernelError::Type(w.ty.name()))?;
        match row {
            quant::Weight::Packed(p) => out.copy_from_slice(&p.dequantize()),
            _ => return Err(KernelError::Type(w.ty.name())),
        }
    }
    Ok(())
}

/// llama.cpp's rounding to the nearest integer (ties to even), valid for
/// |f| < 2^22.
fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Every float16 as float32, made once (256 KiB).
pub(crate) fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

//! llama.cpp's weight blocks as onnxruntime's `MatMulNBits` takes them,
//! without going through float32.
//!
//! Every matrix type of llama.cpp's common files becomes a [`Packed`]
//! weight: values of 2, 4 or 8 bits in blocks of 16 or 32 along the input,
//! a zero point, a factor per block and, where the type has them, a
//! minimum per block (`w = (q - zero) * factor + minimum`):
//!
//! | GGUF type | bits | block | zero | factor | minimum |
//! |---|---|---|---|---|---|
//! | Q4_0 | 4 | 32 | 8 | d | |
//! | Q4_1 | 4 | 32 | 0 | d | m |
//! | Q5_0 | 8 | 32 | 128 (q + 112 stored) | d | |
//! | Q5_1 | 8 | 32 | 128 (q + 128) | d | m |
//! | Q8_0 | 8 | 32 | 128 (q + 128) | d | |
//! | Q2_K | 2 | 16 | 0 | d × 4-bit sc | −dmin × 4-bit m |
//! | Q3_K | 4 | 16 | 4 | d × (6-bit sc − 32) | |
//! | Q4_K | 4 | 32 | 0 | d × 6-bit sc | −dmin × 6-bit m |
//! | Q5_K | 8 | 32 | 128 (q + 128) | d × 6-bit sc | −dmin × 6-bit m |
//! | Q6_K | 8 | 16 | 128 (q + 96) | d × int8 sc | |
//!
//! (`MatMulNBits` takes 2, 4 or 8 bits: a 3-bit value is exact in 4, a
//! 5- or 6-bit one in 8.) A K-quant's factors stay [`Factors::Split`], a
//! float16 per super-block of 256 and a small integer per block, as the
//! file has them: their product needs up to 17 significant bits (float16
//! has 11), so the graph multiplies them in float32 when it is loaded.
//! F32, F16 and BF16 matrices stay in their type ([`Dense`]).
//!
//! Each decoder follows ggml's reference dequantization (ggml-quants.c);
//! the tests check each against a transliteration of those loops.

mod kquant;
mod legacy;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use tessera_common::onnx::ElemType;

use crate::types::GgmlType;

/// Float16 values as little-endian bytes (shared, not copied, by the
/// initializers that hold them).
#[derive(Debug, Clone, PartialEq)]
pub struct Halves(pub Bytes);

impl Halves {
    pub fn from_bits(bits: &[u16]) -> Halves {
        Halves(
            bits.iter()
                .flat_map(|b| b.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        )
    }

    pub fn len(&self) -> usize {
        self.0.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bits(&self, i: usize) -> u16 {
        half_at(&self.0, 2 * i)
    }
}

/// Per-block factors (scales or minimums) of a [`Packed`] weight, row-major
/// over `[rows, blocks]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Factors {
    /// One float16 per block.
    Half(Halves),
    /// A float16 per super-block of 256 (`coarse`, `[rows, supers]`) times
    /// a small integer per block (`fine`, `[rows, blocks]`; two's
    /// complement bytes where `signed`).
    Split {
        coarse: Halves,
        fine: Bytes,
        signed: bool,
    },
}

impl Factors {
    /// The factor of every block as float32.
    pub fn values(&self) -> Vec<f32> {
        match self {
            Factors::Half(h) => (0..h.len()).map(|i| f16(h.bits(i))).collect(),
            Factors::Split {
                coarse,
                fine,
                signed,
            } => {
                let per_super = fine.len() / coarse.len().max(1);
                fine.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let f = if *signed { f as i8 as f32 } else { f as f32 };
                        f * f16(coarse.bits(i / per_super))
                    })
                    .collect()
            }
        }
    }

    /// The factors' rows joined: `parts` must all be of one layout.
    fn concat(parts: &[&Factors]) -> Option<Factors> {
        let join = |bytes: Vec<&Bytes>| -> Bytes {
            let mut all = Vec::with_capacity(bytes.iter().map(|b| b.len()).sum());
            bytes.iter().for_each(|b| all.extend_from_slice(b));
            all.into()
        };
        match parts.first()? {
            Factors::Half(_) => {
                let halves: Option<Vec<&Bytes>> = parts
                    .iter()
                    .map(|p| match p {
                        Factors::Half(h) => Some(&h.0),
                        _ => None,
                    })
                    .collect();
                Some(Factors::Half(Halves(join(halves?))))
            }
            Factors::Split { signed, .. } => {
                let split: Option<Vec<(&Bytes, &Bytes)>> = parts
                    .iter()
                    .map(|p| match p {
                        Factors::Split {
                            coarse,
                            fine,
                            signed: s,
                        } if s == signed => Some((&coarse.0, fine)),
                        _ => None,
                    })
                    .collect();
                let (coarse, fine): (Vec<&Bytes>, Vec<&Bytes>) = split?.into_iter().unzip();
                Some(Factors::Split {
                    coarse: Halves(join(coarse)),
                    fine: join(fine),
                    signed: *signed,
                })
            }
        }
    }

    fn same_layout(&self, other: &Factors) -> bool {
        match (self, other) {
            (Factors::Half(_), Factors::Half(_)) => true,
            (Factors::Split { signed: a, .. }, Factors::Split { signed: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// A `[rows, cols]` weight in `MatMulNBits`' layout (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    pub rows: usize,
    pub cols: usize,
    pub bits: u8,
    /// Inputs per block.
    pub block: usize,
    /// `[rows, cols / block, block * bits / 8]`: in each byte, the value
    /// of the lowest index in the lowest bits.
    pub blobs: Bytes,
    pub scales: Factors,
    /// The stored value that means 0.
    pub zero_point: u8,
    pub minimums: Option<Factors>,
}

impl Packed {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / self.block
    }

    /// `MatMulNBits`' own zero point for these bits (none need be given).
    pub fn default_zero_point(&self) -> u8 {
        1 << (self.bits - 1)
    }

    /// Several weights of one input as one, their rows in order, where all
    /// are of one form (bits, block, zero point, factors' layouts); `None`
    /// otherwise.
    pub fn stack(parts: &[&Packed]) -> Option<Packed> {
        let first = parts.first()?;
        let same = |p: &&Packed| {
            p.cols == first.cols
                && p.bits == first.bits
                && p.block == first.block
                && p.zero_point == first.zero_point
                && p.scales.same_layout(&first.scales)
                && match (&p.minimums, &first.minimums) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.same_layout(b),
                    _ => false,
                }
        };
        if !parts.iter().all(same) {
            return None;
        }
        let scales: Vec<&Factors> = parts.iter().map(|p| &p.scales).collect();
        let minimums = match &first.minimums {
            None => None,
            Some(_) => {
                let m: Vec<&Factors> = parts.iter().filter_map(|p| p.minimums.as_ref()).collect();
                Some(Factors::concat(&m)?)
            }
        };
        Some(Packed {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            bits: first.bits,
            block: first.block,
            blobs: {
                let mut all = Vec::with_capacity(parts.iter().map(|p| p.blobs.len()).sum());
                parts.iter().for_each(|p| all.extend_from_slice(&p.blobs));
                all.into()
            },
            scales: Factors::concat(&scales)?,
            zero_point: first.zero_point,
            minimums,
        })
    }

    /// Every weight as float32, `[rows, cols]` (tests).
    pub fn dequantize(&self) -> Vec<f32> {
        let scales = self.scales.values();
        let minimums = self.minimums.as_ref().map(Factors::values);
        let per_byte = 8 / self.bits as usize;
        let mask = ((1u16 << self.bits) - 1) as u8;
        (0..self.rows * self.cols)
            .map(|i| {
                let byte = self.blobs[i / per_byte];
                let q = (byte >> ((i % per_byte) * self.bits as usize)) & mask;
                let b = i / self.block;
                let w = (f32::from(q) - f32::from(self.zero_point)) * scales[b];
                w + minimums.as_ref().map_or(0.0, |m| m[b])
            })
            .collect()
    }
}

/// A float matrix kept in its type: `data` holds its transpose,
/// `[cols, rows]` (a `MatMul`'s right side), little-endian.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub rows: usize,
    pub cols: usize,
    pub elem: ElemType,
    pub data: Bytes,
}

/// A matrix as the graph takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Weight {
    Packed(Packed),
    Dense(Dense),
    Native(Native),
}

impl Weight {
    pub fn rows(&self) -> usize {
        match self {
            Weight::Packed(p) => p.rows,
            Weight::Dense(d) => d.rows,
            Weight::Native(n) => n.rows,
        }
    }
}

/// A matrix kept as the file's blocks, row after row, for Tessera's own
/// kernels (`crate::kernels`).
#[derive(Debug, Clone, PartialEq)]
pub struct Native {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: Bytes,
}

impl Native {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// Several matrices of one type and input as one, their rows in order.
    fn stack(parts: &[&Native]) -> Option<Native> {
        let first = parts.first()?;
        if !parts
            .iter()
            .all(|p| p.ty == first.ty && p.cols == first.cols)
        {
            return None;
        }
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        parts.iter().for_each(|p| data.extend_from_slice(&p.data));
        Some(Native {
            ty: first.ty,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            data: data.into(),
        })
    }
}

/// Weights of one input used side by side (q, k and v; gate and up): one
/// packed weight where they are of one form, else each alone. Joined when
/// read, so the parts' own bytes are dropped at once.
#[derive(Debug, Clone, PartialEq)]
pub enum Joined {
    /// The parts' rows stacked, and each part's rows.
    One {
        weight: Box<Weight>,
        rows: Vec<usize>,
    },
    Each(Vec<Weight>),
}

impl Joined {
    /// One weight whose rows are the parts' (`rows`, in order) as the file
    /// has it (a fused `attn_qkv`, Phi-3's gate and up).
    pub fn fused(weight: Weight, rows: Vec<usize>) -> Joined {
        Joined::One {
            weight: Box::new(weight),
            rows,
        }
    }

    pub fn new(parts: Vec<Weight>) -> Joined {
        let packed: Option<Vec<&Packed>> = parts
            .iter()
            .map(|w| match w {
                Weight::Packed(p) => Some(p),
                _ => None,
            })
            .collect();
        let native: Option<Vec<&Native>> = parts
            .iter()
            .map(|w| match w {
                Weight::Native(n) => Some(n),
                _ => None,
            })
            .collect();
        let stacked = match (packed, native) {
            (Some(p), _) => Packed::stack(&p).map(Weight::Packed),
            (_, Some(n)) => Native::stack(&n).map(Weight::Native),
            _ => None,
        };
        match stacked {
            Some(weight) => Joined::One {
                rows: parts.iter().map(Weight::rows).collect(),
                weight: Box::new(weight),
            },
            None => Joined::Each(parts),
        }
    }
}

/// Why a tensor's bytes cannot become a weight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("weights of type {0} are not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K are)")]
    Type(String),
    #[error("{len} bytes for [{rows}, {cols}] of {ty}")]
    Length {
        len: usize,
        rows: usize,
        cols: usize,
        ty: String,
    },
}

/// The decoder of each quantized type: bytes of `rows` rows of `cols`.
type Decoder = fn(&[u8], usize, usize) -> Packed;

/// The quantized types read, each with its decoder.
const DECODERS: &[(GgmlType, Decoder)] = &[
    (GgmlType::Q4_0, legacy::q4_0),
    (GgmlType::Q4_1, legacy::q4_1),
    (GgmlType::Q5_0, legacy::q5_0),
    (GgmlType::Q5_1, legacy::q5_1),
    (GgmlType::Q8_0, legacy::q8_0),
    (GgmlType::Q2_K, kquant::q2_k),
    (GgmlType::Q3_K, kquant::q3_k),
    (GgmlType::Q4_K, kquant::q4_k),
    (GgmlType::Q5_K, kquant::q5_k),
    (GgmlType::Q6_K, kquant::q6_k),
];

/// Float types kept as they are, with their ONNX type and element size.
const DENSE: &[(GgmlType, ElemType, usize)] = &[
    (GgmlType::F32, ElemType::FLOAT, 4),
    (GgmlType::F16, ElemType::FLOAT16, 2),
    (GgmlType::BF16, ElemType::BFLOAT16, 2),
];

/// Whether tensors of type `ty` can be read.
pub fn supported(ty: GgmlType) -> bool {
    DECODERS.iter().any(|(t, _)| *t == ty) || DENSE.iter().any(|(t, ..)| *t == ty)
}

/// `[rows, cols]` of type `ty` in `bytes` as a weight: kept as the file's
/// blocks where `native` and Tessera has kernels for the type, else in
/// `MatMulNBits`' layout (or as floats).
pub fn weight_for(
    ty: GgmlType,
    bytes: &[u8],
    (rows, cols): (usize, usize),
    native: bool,
) -> Result<Weight, QuantError> {
    if native && crate::kernels::has_kernel(ty) {
        crate::kernels::Blocks::new(ty, rows, cols, bytes).map_err(|_| QuantError::Length {
            len: bytes.len(),
            rows,
            cols,
            ty: ty.name(),
        })?;
        return Ok(Weight::Native(Native {
            ty,
            rows,
            cols,
            data: Bytes::copy_from_slice(bytes),
        }));
    }
    weight(ty, bytes, rows, cols)
}

/// `[rows, cols]` of type `ty` in `bytes` as a weight.
pub fn weight(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Weight, QuantError> {
    let expected = ty
        .data_len(&[cols as u64, rows as u64])
        .map_err(|_| QuantError::Type(ty.name()))?;
    if bytes.len() as u64 != expected {
        return Err(QuantError::Length {
            len: bytes.len(),
            rows,
            cols,
            ty: ty.name(),
        });
    }
    if let Some((_, decode)) = DECODERS.iter().find(|(t, _)| *t == ty) {
        return Ok(Weight::Packed(decode(bytes, rows, cols)));
    }
    let (_, elem, size) = DENSE
        .iter()
        .find(|(t, ..)| *t == ty)
        .ok_or_else(|| QuantError::Type(ty.name()))?;
    Ok(Weight::Dense(Dense {
        rows,
        cols,
        elem: *elem,
        data: transpose(bytes, rows, cols, *size).into(),
    }))
}

/// `[rows, cols]` elements of `size` bytes as `[cols, rows]`.
pub fn transpose(bytes: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    const TILE: usize = 32;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    let from = (r * cols + c) * size;
                    let to = (c * rows + r) * size;
                    out[to..to + size].copy_from_slice(&bytes[from..from + size]);
                }
            }
        }
    }
    out
}

/// A float16's bits at `bytes[at..at + 2]`.
fn half_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn f16(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Values `0..2^bits` in order as `MatMulNBits`' bytes.
fn pack(values: &[u8], bits: u8, out: &mut Vec<u8>) {
    match bits {
        8 => out.extend_from_slice(values),
        4 => out.extend(values.chunks_exact(2).map(|v| v[0] | (v[1] << 4))),
        2 => out.extend(
            values
                .chunks_exact(4)
                .map(|v| v[0] | (v[1] << 2) | (v[2] << 4) | (v[3] << 6)),
        ),
        _ => unreachable!("MatMulNBits takes 2, 4 or 8 bits"),
    }
}

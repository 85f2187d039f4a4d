//! The token embedding in its file's type: the lookup gathers rows
//! (a float table's, or a packed one's bytes and factors, unpacked and
//! scaled by standard operators) and a head tied to it is the same table's
//! product (`Gemm` over a float one, `MatMulNBits` over packed bytes):
//! one copy of the table serves both.

use bytes::Bytes;
use tessera_common::onnx::ElemType;

use super::linear::{flat_factors, linear, native_blocks, packed_blobs};
use super::{Attr, GraphBuilder};
use crate::kernels;
use crate::quant::{Factors, Native, Packed, Weight};

/// The initializer's name (Hugging Face's).
pub const NAME: &str = "model.embed_tokens.weight";

/// A token embedding `[vocab, hidden]`.
#[derive(Debug, Clone)]
pub enum Table {
    /// Float rows as the file has them (not transposed).
    Dense {
        elem: ElemType,
        rows: usize,
        cols: usize,
        data: Bytes,
    },
    Packed(Packed),
    /// The file's blocks, for Tessera's kernels.
    Native(Native),
}

impl Table {
    pub fn rows(&self) -> usize {
        match self {
            Table::Dense { rows, .. } => *rows,
            Table::Packed(p) => p.rows,
            Table::Native(n) => n.rows,
        }
    }
}

/// The rows of `input_ids`, `[batch, sequence, hidden]`.
pub fn lookup(b: &mut GraphBuilder, table: &Table, hidden: usize) -> String {
    let p = "/model/embed_tokens";
    match table {
        Table::Dense {
            elem,
            rows,
            cols,
            data,
        } => {
            let t = b.weight(NAME, *elem, &[*rows, *cols], data.clone());
            let x = b.op(
                "Gather",
                &[&t, "input_ids"],
                &format!("{p}/Gather"),
                &[Attr::Int("axis", 0)],
            );
            if *elem == ElemType::FLOAT {
                x
            } else {
                b.to_float(&x, &format!("{p}/Cast"))
            }
        }
        Table::Packed(w) => packed_lookup(b, w, hidden, p),
        Table::Native(n) => {
            let blocks = native_blocks(b, n, NAME);
            let out = format!("{p}/GgmlGather/output_0");
            b.node(
                kernels::GATHER,
                kernels::DOMAIN,
                &[&blocks, "input_ids"],
                &format!("{p}/GgmlGather"),
                &[&out],
                &[
                    Attr::Int("type", n.ty.0 as i64),
                    Attr::Int("K", n.cols as i64),
                ],
            );
            out
        }
    }
}

fn packed_lookup(b: &mut GraphBuilder, w: &Packed, hidden: usize, p: &str) -> String {
    let blobs = packed_blobs(b, w, NAME);
    let rows = b.op(
        "Gather",
        &[&blobs, "input_ids"],
        &format!("{p}/Gather"),
        &[Attr::Int("axis", 0)],
    );
    let values = unpack(b, &rows, w, p);
    let mut x = if w.zero_point == 0 {
        values
    } else {
        let zero = b.scalar(ElemType::FLOAT, w.zero_point.into());
        b.op("Sub", &[&values, &zero], &format!("{p}/Sub"), &[])
    };
    let scales = row_factors(
        b,
        &w.scales,
        w,
        &format!("{NAME}.scales"),
        &format!("{p}/scales"),
    );
    x = b.op("Mul", &[&x, &scales], &format!("{p}/Mul"), &[]);
    if let Some(m) = &w.minimums {
        let name = format!("{NAME}.row_minimums");
        let minimums = row_factors(b, m, w, &name, &format!("{p}/minimums"));
        x = b.op("Add", &[&x, &minimums], &format!("{p}/Add"), &[]);
    }
    let batch_seq = b.op("Shape", &["input_ids"], &format!("{p}/Shape"), &[]);
    let h = b.ints(&[hidden as i64]);
    let shape = b.op(
        "Concat",
        &[&batch_seq, &h],
        &format!("{p}/Concat"),
        &[Attr::Int("axis", 0)],
    );
    b.op("Reshape", &[&x, &shape], &format!("{p}/Reshape"), &[])
}

/// Gathered rows of packed bytes `[.., blocks, bytes]` as float values
/// `[.., blocks, block]` (zero point not yet taken off): each byte's
/// `bits`-wide fields, lowest first, by shifts and subtractions.
fn unpack(b: &mut GraphBuilder, rows: &str, w: &Packed, p: &str) -> String {
    if w.bits == 8 {
        return b.to_float(rows, &format!("{p}/Cast"));
    }
    let fields = 8 / w.bits as usize;
    let bits = b.scalar(ElemType::UINT8, w.bits.into());
    // shifted[k] = byte >> (k * bits); field k = shifted[k] - (shifted[k+1] << bits).
    let mut shifted = vec![rows.to_string()];
    for k in 1..fields {
        let prev = shifted[k - 1].clone();
        let s = b.op(
            "BitShift",
            &[&prev, &bits],
            &format!("{p}/unpack/BitShift_{k}"),
            &[Attr::Str("direction", "RIGHT")],
        );
        shifted.push(s);
    }
    let last_axis = b.ints(&[-1]);
    let mut parts = Vec::new();
    for k in 0..fields {
        let field = if k + 1 == fields {
            shifted[k].clone()
        } else {
            let up = b.op(
                "BitShift",
                &[&shifted[k + 1], &bits],
                &format!("{p}/unpack/BitShift_left_{k}"),
                &[Attr::Str("direction", "LEFT")],
            );
            b.op(
                "Sub",
                &[&shifted[k], &up],
                &format!("{p}/unpack/Sub_{k}"),
                &[],
            )
        };
        parts.push(b.op(
            "Unsqueeze",
            &[&field, &last_axis],
            &format!("{p}/unpack/Unsqueeze_{k}"),
            &[],
        ));
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    let stacked = b.op(
        "Concat",
        &refs,
        &format!("{p}/unpack/Concat"),
        &[Attr::Int("axis", -1)],
    );
    let shape = b.ints(&[0, 0, w.blocks_per_row() as i64, w.block as i64]);
    let values = b.op(
        "Reshape",
        &[&stacked, &shape],
        &format!("{p}/unpack/Reshape"),
        &[],
    );
    b.to_float(&values, &format!("{p}/Cast"))
}

/// The gathered rows' factors, `[.., blocks, 1]`.
fn row_factors(b: &mut GraphBuilder, f: &Factors, w: &Packed, name: &str, p: &str) -> String {
    let flat = flat_factors(b, f, w, name);
    let shape = b.ints(&[w.rows as i64, w.blocks_per_row() as i64]);
    let table = b.op(
        "Reshape",
        &[&flat, &shape],
        &format!("{p}/table/Reshape"),
        &[],
    );
    let rows = b.op(
        "Gather",
        &[&table, "input_ids"],
        &format!("{p}/Gather"),
        &[Attr::Int("axis", 0)],
    );
    let last_axis = b.ints(&[-1]);
    b.op(
        "Unsqueeze",
        &[&rows, &last_axis],
        &format!("{p}/Unsqueeze"),
        &[],
    )
}

/// `x @ table^T` for a head tied to the embedding: `[batch, 1, hidden]`
/// to `[batch, 1, vocab]` (`Gemm` takes the float table as it is, rows
/// flattened).
pub fn tied_head(b: &mut GraphBuilder, x: &str, table: &Table, hidden: usize, p: &str) -> String {
    match table {
        Table::Dense { elem, .. } => {
            let mut t = NAME.to_string();
            if *elem != ElemType::FLOAT {
                t = b.to_float(&t, &format!("{NAME}/Cast"));
            }
            let shape = b.ints(&[-1, hidden as i64]);
            let rows = b.op("Reshape", &[x, &shape], &format!("{p}/Reshape"), &[]);
            let flat = b.op(
                "Gemm",
                &[&rows, &t],
                &format!("{p}/Gemm"),
                &[Attr::Int("transB", 1)],
            );
            let axis = b.ints(&[1]);
            b.op("Unsqueeze", &[&flat, &axis], &format!("{p}/Unsqueeze"), &[])
        }
        Table::Packed(w) => linear(b, x, &Weight::Packed(w.clone()), None, NAME, p),
        Table::Native(n) => linear(b, x, &Weight::Native(n.clone()), None, NAME, p),
    }
}

//! Products `x @ W^T` for each weight form: `MatMulNBits` over a packed
//! weight's blocks (plus each block's input sum times its minimum, where
//! the type has minimums: onnxruntime's fast kernels take integer zero
//! points only), `MatMul` over a float one.
//!
//! Factors are stored as the GGUF has them (float16s, a K-quant's float16
//! per super-block and small integer per block) and turned into float32
//! by `Cast` and `Mul` nodes over initializers alone, which onnxruntime
//! folds when it loads the model: the model's bytes stay the file's.

use tessera_common::onnx::ElemType;

use super::{Attr, GraphBuilder};
use bytes::Bytes;

use crate::kernels;
use crate::quant::{transpose, Dense, Factors, Halves, Joined, Native, Packed, Weight};

/// `x @ W^T (+ bias)`; `name` names the weight's initializers, `prefix`
/// the nodes.
pub fn linear(
    b: &mut GraphBuilder,
    x: &str,
    w: &Weight,
    bias: Option<&[f32]>,
    name: &str,
    prefix: &str,
) -> String {
    let y = match w {
        Weight::Packed(p) => packed_product(b, x, p, name, prefix),
        Weight::Dense(d) => dense_product(b, x, d, name, prefix),
        Weight::Native(n) => native_product(b, x, n, name, prefix),
    };
    match bias {
        Some(values) => {
            let bias = b.floats(&format!("{name}.bias"), &[values.len()], values);
            b.op("Add", &[&y, &bias], &format!("{prefix}/bias/Add"), &[])
        }
        None => y,
    }
}

/// The file's blocks as an initializer `[rows, bytes a row]`, made once
/// (a tied head and the embedding's lookup share it).
pub fn native_blocks(b: &mut GraphBuilder, n: &Native, name: &str) -> String {
    if !b
        .initializers
        .iter()
        .any(|t| t.name.as_deref() == Some(name))
    {
        b.weight(
            name,
            ElemType::UINT8,
            &[n.rows, n.row_bytes()],
            n.data.clone(),
        );
    }
    name.to_string()
}

/// `x @ W^T` by Tessera's kernel over the file's blocks.
fn native_product(b: &mut GraphBuilder, x: &str, n: &Native, name: &str, prefix: &str) -> String {
    let blocks = native_blocks(b, n, name);
    let out = format!("{prefix}/GgmlMatMul/output_0");
    b.node(
        kernels::MATMUL,
        kernels::DOMAIN,
        &[x, &blocks],
        &format!("{prefix}/GgmlMatMul"),
        &[&out],
        &[
            Attr::Int("type", n.ty.0 as i64),
            Attr::Int("K", n.cols as i64),
            Attr::Int("N", n.rows as i64),
        ],
    );
    out
}

fn dense_product(b: &mut GraphBuilder, x: &str, d: &Dense, name: &str, prefix: &str) -> String {
    let mut right = b.weight(name, d.elem, &[d.cols, d.rows], d.data.clone());
    if d.elem != ElemType::FLOAT {
        right = b.to_float(&right, &format!("{name}/Cast"));
    }
    b.op("MatMul", &[x, &right], &format!("{prefix}/MatMul"), &[])
}

fn packed_product(b: &mut GraphBuilder, x: &str, p: &Packed, name: &str, prefix: &str) -> String {
    let blobs = packed_blobs(b, p, name);
    let scales = flat_factors(b, &p.scales, p, &format!("{name}.scales"));
    let mut inputs = vec![x.to_string(), blobs, scales];
    if p.zero_point != p.default_zero_point() {
        inputs.push(zero_points(b, p, name));
    }
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let scaled = b.ms_op(
        "MatMulNBits",
        &inputs,
        &format!("{prefix}/MatMulNBits"),
        &[
            Attr::Int("K", p.cols as i64),
            Attr::Int("N", p.rows as i64),
            Attr::Int("bits", p.bits as i64),
            Attr::Int("block_size", p.block as i64),
            Attr::Int("accuracy_level", b.accuracy_level),
        ],
    );
    match &p.minimums {
        None => scaled,
        Some(m) => {
            let sums = block_sums(b, x, p.blocks_per_row(), p.block);
            let minimums = transposed_factors(b, m, p, &format!("{name}.minimums"));
            let shift = b.op(
                "MatMul",
                &[&sums, &minimums],
                &format!("{prefix}/minimums/MatMul"),
                &[],
            );
            b.op("Add", &[&scaled, &shift], &format!("{prefix}/Add"), &[])
        }
    }
}

/// The weight's values as an initializer `[rows, blocks, bytes per block]`
/// (what `MatMulNBits` takes and an embedding's lookup gathers rows of),
/// made once.
pub fn packed_blobs(b: &mut GraphBuilder, p: &Packed, name: &str) -> String {
    if !b
        .initializers
        .iter()
        .any(|t| t.name.as_deref() == Some(name))
    {
        let per_block = p.block * p.bits as usize / 8;
        let dims = [p.rows, p.blocks_per_row(), per_block];
        b.weight(name, ElemType::UINT8, &dims, p.blobs.clone());
    }
    name.to_string()
}

/// Zero points for every block, packed as `MatMulNBits` takes them (each
/// row's blocks' points in `bits`-wide fields, rows byte-aligned).
fn zero_points(b: &mut GraphBuilder, p: &Packed, name: &str) -> String {
    let per_row = (p.blocks_per_row() * p.bits as usize).div_ceil(8);
    let mut byte = 0u8;
    for k in 0..8 / p.bits {
        byte |= p.zero_point << (k * p.bits);
    }
    let data = vec![byte; p.rows * per_row];
    b.weight(
        &format!("{name}.zero_points"),
        ElemType::UINT8,
        &[p.rows * per_row],
        data.into(),
    )
}

/// Half-precision values stored as they are (shared, not copied) and
/// cast to float32.
fn half(b: &mut GraphBuilder, values: &Halves, dims: &[usize], name: &str) -> String {
    let stored = b.weight(
        &format!("{name}.f16"),
        ElemType::FLOAT16,
        dims,
        values.0.clone(),
    );
    b.to_float(&stored, &format!("{name}/Cast"))
}

/// A split factor's float32 product of `dims` (`fine` reshaped to
/// `fine_dims`, `coarse` to `coarse_dims`, broadcast).
fn split_product(
    b: &mut GraphBuilder,
    (fine, signed): (&Bytes, bool),
    coarse: &Halves,
    (fine_dims, coarse_dims): (&[usize], &[usize]),
    name: &str,
) -> String {
    let elem = if signed {
        ElemType::INT8
    } else {
        ElemType::UINT8
    };
    let fine = b.weight(&format!("{name}.fine"), elem, fine_dims, fine.clone());
    let fine = b.to_float(&fine, &format!("{name}/fine/Cast"));
    let coarse = half(b, coarse, coarse_dims, &format!("{name}.coarse"));
    b.op("Mul", &[&fine, &coarse], &format!("{name}/Mul"), &[])
}

/// Per-block factors as float32 `[rows * blocks]` (`MatMulNBits`' scales),
/// made once under `name`.
pub fn flat_factors(b: &mut GraphBuilder, f: &Factors, p: &Packed, name: &str) -> String {
    let done = format!("{name}/flat");
    if b.made(&done) {
        return format!("{done}/output_0");
    }
    if b.made(&format!("{name}/Cast")) {
        return format!("{name}/Cast/output_0");
    }
    match f {
        Factors::Half(h) => half(b, h, &[h.len()], name),
        Factors::Split {
            coarse,
            fine,
            signed,
        } => {
            let supers = coarse.len() / p.rows;
            let per = p.blocks_per_row() / supers;
            let product = split_product(
                b,
                (fine, *signed),
                coarse,
                (&[p.rows, supers, per], &[p.rows, supers, 1]),
                name,
            );
            let flat = b.ints(&[-1]);
            b.op("Reshape", &[&product, &flat], &done, &[])
        }
    }
}

/// Per-block factors as float32 `[blocks, rows]` (the right side of the
/// minimums' product), stored transposed.
fn transposed_factors(b: &mut GraphBuilder, f: &Factors, p: &Packed, name: &str) -> String {
    let (rows, blocks) = (p.rows, p.blocks_per_row());
    match f {
        Factors::Half(h) => {
            let t = Halves(transpose(&h.0, rows, blocks, 2).into());
            half(b, &t, &[blocks, rows], name)
        }
        Factors::Split {
            coarse,
            fine,
            signed,
        } => {
            let supers = coarse.len() / rows;
            let per = blocks / supers;
            let fine_t: Bytes = transpose(fine, rows, blocks, 1).into();
            let coarse_t = Halves(transpose(&coarse.0, rows, supers, 2).into());
            let product = split_product(
                b,
                (&fine_t, *signed),
                &coarse_t,
                (&[supers, per, rows], &[supers, 1, rows]),
                name,
            );
            let shape = b.ints(&[blocks as i64, rows as i64]);
            b.op(
                "Reshape",
                &[&product, &shape],
                &format!("{name}/Reshape"),
                &[],
            )
        }
    }
}

/// `x`'s sums over blocks of `block` along its last axis (`[.., blocks]`),
/// made once per tensor and block size (q, k and v share theirs).
fn block_sums(b: &mut GraphBuilder, x: &str, blocks: usize, block: usize) -> String {
    let name = format!("{x}/block_sums_{block}");
    if b.made(&name) {
        return format!("{name}/output_0");
    }
    let shape = b.ints(&[0, 0, blocks as i64, block as i64]);
    let split = b.op("Reshape", &[x, &shape], &format!("{name}/Reshape"), &[]);
    let axes = b.ints(&[-1]);
    b.op(
        "ReduceSum",
        &[&split, &axes],
        &name,
        &[Attr::Int("keepdims", 0)],
    )
}

/// `x @ [W1; W2; ...]^T (+ biases)`: one product where the weights are
/// joined, else one each with their outputs concatenated.
pub fn packed_linear(
    b: &mut GraphBuilder,
    x: &str,
    joined: &Joined,
    biases: &[Option<Vec<f32>>],
    name: &str,
    prefix: &str,
) -> String {
    match joined {
        Joined::One { weight, rows } => {
            let bias = biases.iter().any(Option::is_some).then(|| {
                rows.iter()
                    .zip(biases)
                    .flat_map(|(&n, b)| b.clone().unwrap_or_else(|| vec![0.0; n]))
                    .collect::<Vec<f32>>()
            });
            linear(b, x, weight, bias.as_deref(), name, prefix)
        }
        Joined::Each(parts) => {
            let outputs = each(b, x, parts, biases, name, prefix);
            let refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
            b.op(
                "Concat",
                &refs,
                &format!("{prefix}/Concat"),
                &[Attr::Int("axis", -1)],
            )
        }
    }
}

fn each(
    b: &mut GraphBuilder,
    x: &str,
    parts: &[Weight],
    biases: &[Option<Vec<f32>>],
    name: &str,
    prefix: &str,
) -> Vec<String> {
    parts
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let bias = biases.get(i).and_then(|b| b.as_deref());
            linear(
                b,
                x,
                w,
                bias,
                &format!("{name}.{i}"),
                &format!("{prefix}/{i}"),
            )
        })
        .collect()
}

/// `x @ W^T` for each weight: one product split back per weight where
/// they are joined, else one each.
pub fn stacked_linear(
    b: &mut GraphBuilder,
    x: &str,
    joined: &Joined,
    name: &str,
    prefix: &str,
) -> Vec<String> {
    let (weight, rows) = match joined {
        Joined::One { weight, rows } => (weight, rows),
        Joined::Each(parts) => return each(b, x, parts, &[], name, prefix),
    };
    let y = linear(b, x, weight, None, name, prefix);
    let sizes: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let sizes = b.ints(&sizes);
    let outputs: Vec<String> = (0..rows.len())
        .map(|i| format!("{prefix}/Split/output_{i}"))
        .collect();
    let refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    b.node(
        "Split",
        "",
        &[&y, &sizes],
        &format!("{prefix}/Split"),
        &refs,
        &[Attr::Int("axis", -1)],
    );
    outputs
}

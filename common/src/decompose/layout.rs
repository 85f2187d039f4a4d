//! CenterCropPad and AffineGrid (opset 18 / 20 function ops) for constant
//! target shapes, written with the static shapes known at rewrite time.

use super::emit::{Attr, Emit};
use super::{attr_i, attr_ints, data_io, input, output, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::proto::NodeProto;

/// CenterCropPad: per axis, a centred Slice where the input is larger than
/// the target and a centred zero Pad where it is smaller (the extra element
/// of an odd difference goes to the end, as in the function body).
pub(super) fn center_crop_pad(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let shape_input = input(node, 1).ok_or_else(|| invalid("no shape"))?;
    let target = ctx
        .const_ints(shape_input)
        .ok_or_else(|| unknown("the target shape is not a constant"))?;
    let dims = ctx.input_shape(x)?;
    let rank = dims.len() as i64;
    let axes: Vec<i64> = match attr_ints(node, "axes") {
        Some(a) => a
            .iter()
            .map(|&a| if a < 0 { a + rank } else { a })
            .collect(),
        None => (0..rank).collect(),
    };
    if axes.len() != target.len() || axes.iter().any(|&a| a < 0 || a >= rank) {
        return Err(invalid("axes do not match the target shape"));
    }
    let (mut starts, mut ends, mut slice_axes) = (Vec::new(), Vec::new(), Vec::new());
    let mut pads = vec![0i64; 2 * dims.len()];
    for (&axis, &want) in axes.iter().zip(&target) {
        let have = dims[axis as usize];
        if want < have {
            let begin = (have - want) / 2;
            starts.push(begin);
            ends.push(begin + want);
            slice_axes.push(axis);
        } else if want > have {
            let begin = (want - have) / 2;
            pads[axis as usize] = begin;
            pads[dims.len() + axis as usize] = want - have - begin;
        }
    }
    let mut current = x.to_string();
    let pad = pads.iter().any(|&p| p != 0);
    if !slice_axes.is_empty() {
        let n = slice_axes.len();
        let s = emit.constant::<i64>(&[n], &starts)?;
        let e = emit.constant::<i64>(&[n], &ends)?;
        let a = emit.constant::<i64>(&[n], &slice_axes)?;
        let into = (!pad).then_some(y);
        current = emit
            .op_into("Slice", &[&current, &s, &e, &a], &[], &[into])
            .remove(0);
    }
    if pad {
        let p = emit.constant::<i64>(&[pads.len()], &pads)?;
        emit.op_into("Pad", &[&current, &p], &[], &[Some(y)]);
    } else if slice_axes.is_empty() {
        emit.op_into("Identity", &[&current], &[], &[Some(y)]);
    }
    Ok(())
}

/// Normalized grid coordinates along an axis of `len` points.
pub(super) fn coordinates(len: i64, align_corners: bool) -> Vec<f64> {
    (0..len)
        .map(|i| {
            let i = i as f64;
            if align_corners {
                if len == 1 {
                    -1.0
                } else {
                    -1.0 + 2.0 * i / (len - 1) as f64
                }
            } else {
                -1.0 + (2.0 * i + 1.0) / len as f64
            }
        })
        .collect()
}

/// AffineGrid: `grid[n, (d,) h, w] = theta[n] · (x_w, y_h, (z_d,) 1)` as one
/// MatMul of a constant base grid with `theta` transposed, then a Reshape.
pub(super) fn affine_grid(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let theta = input(node, 0).ok_or_else(|| invalid("no theta"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let size = ctx
        .const_ints(input(node, 1).ok_or_else(|| invalid("no size"))?)
        .ok_or_else(|| unknown("size is not a constant"))?;
    let elem = ctx
        .elem(theta)
        .ok_or_else(|| unknown("theta of unknown type"))?;
    let align = attr_i(node, "align_corners").unwrap_or(0) != 0;
    let spatial: Vec<i64> = match size.len() {
        4 | 5 => size[2..].to_vec(),
        n => return Err(unsupported(format!("size of length {n}"))),
    };
    if spatial.iter().chain(&size[..1]).any(|&d| d < 1) {
        return Err(invalid("empty grid"));
    }
    // Coordinates per spatial axis, innermost (x, along W) first.
    let axes: Vec<Vec<f64>> = spatial
        .iter()
        .rev()
        .map(|&l| coordinates(l, align))
        .collect();
    let points: i64 = spatial.iter().product();
    let k = spatial.len();
    let mut base = Vec::with_capacity(points as usize * (k + 1));
    for p in 0..points {
        let mut rest = p;
        for axis in &axes {
            let len = axis.len() as i64;
            base.push(axis[(rest % len) as usize] as f32);
            rest /= len;
        }
        base.push(1.0);
    }
    let base = emit.constant::<f32>(&[1, points as usize, k + 1], &base)?;
    let base = emit.from_f32(base, elem);
    let t = emit.op("Transpose", &[theta], &[Attr::Ints("perm", vec![0, 2, 1])]);
    let grid = emit.op("MatMul", &[&base, &t], &[]);
    let mut shape = vec![size[0]];
    shape.extend(&spatial);
    shape.push(k as i64);
    let s = emit.constant::<i64>(&[shape.len()], &shape)?;
    emit.op_into("Reshape", &[&grid, &s], &[], &[Some(y)]);
    Ok(())
}

/// Largest constant index table a rewrite may create.
const MAX_TABLE: i64 = 1 << 22;

/// ReverseSequence with constant `sequence_lens` and a static shape: one
/// Gather of the flattened input with a constant table of source positions.
pub(super) fn reverse_sequence(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let lens = ctx
        .const_ints(input(node, 1).ok_or_else(|| invalid("no sequence_lens"))?)
        .ok_or_else(|| unknown("sequence_lens is not a constant"))?;
    let dims = ctx.input_shape(x)?;
    let batch_axis = attr_i(node, "batch_axis").unwrap_or(1) as usize;
    let time_axis = attr_i(node, "time_axis").unwrap_or(0) as usize;
    if dims.len() < 2 || batch_axis > 1 || time_axis > 1 || batch_axis == time_axis {
        return Err(unsupported("batch and time axes must be 0 and 1"));
    }
    let total: i64 = dims.iter().product();
    if total > MAX_TABLE || lens.len() as i64 != dims[batch_axis] {
        return Err(invalid(
            "input too large or sequence_lens of the wrong length",
        ));
    }
    let inner: i64 = dims[2..].iter().product();
    let time = dims[time_axis];
    let mut table = Vec::with_capacity(total as usize);
    for a in 0..dims[0] {
        for b in 0..dims[1] {
            let (batch, t) = if batch_axis == 0 { (a, b) } else { (b, a) };
            let len = lens[batch as usize].clamp(0, time);
            let src_t = if t < len { len - 1 - t } else { t };
            let (sa, sb) = if batch_axis == 0 {
                (a, src_t)
            } else {
                (src_t, b)
            };
            let base = (sa * dims[1] + sb) * inner;
            table.extend(base..base + inner);
        }
    }
    let flat = emit.constant::<i64>(&[1], &[-1])?;
    let flat_x = emit.op("Reshape", &[x, &flat], &[]);
    let table = emit.constant::<i64>(&[table.len()], &table)?;
    let gathered = emit.op("Gather", &[&flat_x, &table], &[Attr::Int("axis", 0)]);
    let shape = emit.constant::<i64>(&[dims.len()], &dims)?;
    emit.op_into("Reshape", &[&gathered, &shape], &[], &[Some(y)]);
    Ok(())
}

/// Col2Im as a grouped ConvTranspose: the columns, reshaped to
/// `[N, C·K, L_1, ..]`, transposed-convolved (one group per channel) with a
/// constant one-hot kernel that puts column `k` at block position `k`; the
/// overlapping sums are Col2Im's.
pub(super) fn col2im(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let image = ctx
        .const_ints(input(node, 1).ok_or_else(|| invalid("no image_shape"))?)
        .ok_or_else(|| unknown("image_shape is not a constant"))?;
    let block = ctx
        .const_ints(input(node, 2).ok_or_else(|| invalid("no block_shape"))?)
        .ok_or_else(|| unknown("block_shape is not a constant"))?;
    let dims = ctx.input_shape(x)?;
    let elem = ctx.input_elem(x)?;
    let n = image.len();
    let ones = vec![1; n];
    let dilations = attr_ints(node, "dilations").map_or(ones.clone(), <[i64]>::to_vec);
    let strides = attr_ints(node, "strides").map_or(ones, <[i64]>::to_vec);
    let pads = attr_ints(node, "pads").map_or(vec![0; 2 * n], <[i64]>::to_vec);
    if dims.len() != 3 || block.len() != n || dilations.len() != n || strides.len() != n {
        return Err(invalid("inconsistent ranks"));
    }
    if pads.len() != 2 * n
        || block
            .iter()
            .chain(&strides)
            .chain(&dilations)
            .any(|&v| v < 1)
    {
        return Err(invalid("bad pads, strides, dilations or block"));
    }
    let k: i64 = block.iter().product();
    if dims[1] % k != 0 {
        return Err(invalid("channels not a multiple of the block size"));
    }
    let channels = dims[1] / k;
    let mut counts = Vec::with_capacity(n);
    let mut output_padding = Vec::with_capacity(n);
    for d in 0..n {
        let span = image[d] + pads[d] + pads[n + d] - dilations[d] * (block[d] - 1) - 1;
        if span < 0 {
            return Err(invalid("block larger than the padded image"));
        }
        let count = span / strides[d] + 1;
        let full =
            strides[d] * (count - 1) + dilations[d] * (block[d] - 1) + 1 - pads[d] - pads[n + d];
        counts.push(count);
        output_padding.push(image[d] - full);
    }
    if counts.iter().product::<i64>() != dims[2] {
        return Err(invalid("the number of blocks does not match the input"));
    }
    if channels * k * k > MAX_TABLE {
        return Err(unsupported("kernel too large"));
    }
    // Weight [C·K, 1, b_1, ..]: one-hot at the column's block position.
    let mut weight = vec![0f32; (channels * k * k) as usize];
    for c in 0..channels {
        for j in 0..k {
            weight[((c * k + j) * k + j) as usize] = 1.0;
        }
    }
    let mut wdims = vec![(channels * k) as usize, 1];
    wdims.extend(block.iter().map(|&b| b as usize));
    let w = emit.constant::<f32>(&wdims, &weight)?;
    let w = emit.from_f32(w, elem);
    let mut shape = vec![dims[0], dims[1]];
    shape.extend(&counts);
    let s = emit.constant::<i64>(&[shape.len()], &shape)?;
    let grid = emit.op("Reshape", &[x, &s], &[]);
    let mut attrs = vec![
        Attr::Int("group", channels),
        Attr::Ints("kernel_shape", block.clone()),
        Attr::Ints("strides", strides),
        Attr::Ints("dilations", dilations),
        Attr::Ints("pads", pads),
    ];
    if output_padding.iter().any(|&p| p != 0) {
        attrs.push(Attr::Ints("output_padding", output_padding));
    }
    emit.op_into("ConvTranspose", &[&grid, &w], &attrs, &[Some(y)]);
    Ok(())
}

/// `x` gathered along each axis with a constant table (`None`: the axis is
/// kept as it is).
fn gather_axes(
    emit: &mut Emit,
    x: &str,
    tables: &[Option<Vec<i64>>],
    y: &str,
) -> Result<(), Declined> {
    let last = tables.iter().rposition(Option::is_some);
    let Some(last) = last else {
        emit.op_into("Identity", &[x], &[], &[Some(y)]);
        return Ok(());
    };
    let mut current = x.to_string();
    for (axis, table) in tables.iter().enumerate() {
        let Some(table) = table else { continue };
        let t = emit.constant::<i64>(&[table.len()], table)?;
        let into = (axis == last).then_some(y);
        current = emit
            .op_into(
                "Gather",
                &[&current, &t],
                &[Attr::Int("axis", axis as i64)],
                &[into],
            )
            .remove(0);
    }
    Ok(())
}

/// Upsample (opset 7–9) in `nearest` mode with constant scales: source
/// index `floor(i / scale)` along each axis.
pub(super) fn upsample_nearest(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    if super::attr_s(node, "mode").unwrap_or("nearest") != "nearest" {
        return Err(unsupported("only nearest mode"));
    }
    let scales = match input(node, 1) {
        Some(s) => ctx
            .const_floats(s)
            .ok_or_else(|| unknown("scales are not a constant"))?,
        None => super::attr(node, "scales")
            .map(|a| a.floats.iter().map(|&f| f64::from(f)).collect())
            .ok_or_else(|| invalid("no scales"))?,
    };
    let dims = ctx.input_shape(x)?;
    if scales.len() != dims.len() || scales.iter().any(|&s| s <= 0.0) {
        return Err(invalid("scales do not match the input"));
    }
    let mut tables = Vec::with_capacity(dims.len());
    for (&d, &s) in dims.iter().zip(&scales) {
        let out = (d as f64 * s).floor() as i64;
        if out > MAX_TABLE {
            return Err(unsupported("output too large"));
        }
        tables.push((s != 1.0).then(|| {
            (0..out)
                .map(|i| ((i as f64 / s).floor() as i64).min(d - 1))
                .collect()
        }));
    }
    gather_axes(emit, x, &tables, y)
}

/// Pad in `wrap` mode with constant pads: source index `(i - begin) mod d`
/// along each padded axis (negative pads crop).
pub(super) fn wrap_pad(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    if super::attr_s(node, "mode") != Some("wrap") {
        return Err(native("only wrap mode is rewritten"));
    }
    let (x, y) = data_io(node)?;
    let pads = ctx
        .const_ints(input(node, 1).ok_or_else(|| invalid("no pads"))?)
        .ok_or_else(|| unknown("pads are not a constant"))?;
    let dims = ctx.input_shape(x)?;
    let rank = dims.len() as i64;
    let axes: Vec<i64> = match input(node, 3) {
        Some(a) => ctx
            .const_ints(a)
            .ok_or_else(|| unknown("axes are not a constant"))?
            .into_iter()
            .map(|a| if a < 0 { a + rank } else { a })
            .collect(),
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() || axes.iter().any(|&a| !(0..rank).contains(&a)) {
        return Err(invalid("pads do not match the axes"));
    }
    let mut tables = vec![None; dims.len()];
    for (k, &axis) in axes.iter().enumerate() {
        let (begin, end) = (pads[k], pads[axes.len() + k]);
        let d = dims[axis as usize];
        let out = d + begin + end;
        if d < 1 || !(0..=MAX_TABLE).contains(&out) {
            return Err(unsupported("empty or too large"));
        }
        if begin != 0 || end != 0 {
            tables[axis as usize] = Some((0..out).map(|i| (i - begin).rem_euclid(d)).collect());
        }
    }
    gather_axes(emit, x, &tables, y)
}

//! Resize (linear or cubic, `align_corners`) of a static-shape tensor by
//! constant scales or sizes, as one MatMul per resized axis with a
//! constant interpolation matrix (what onnxruntime 1.32 computes wrongly
//! when it downsamples this way).
//!
//! Resize interpolates each axis in turn, so along axis `a` the output is
//! `M · x` with `M[o][i]` the weight input index `i` gets for output index
//! `o`: with `align_corners`, output `o` samples input coordinate
//! `x = o·(in − 1)/(len − 1)` (0 when `len` is 1), where `len` is
//! `in · scale` unrounded (the specification's length, which onnxruntime
//! rounds down first), from its 2 (linear) or 4
//! (cubic, coefficient `cubic_coeff_a`) neighbours `⌊x⌋ − n/2 + 1 …`,
//! indices past the edges clamped to it, or (`exclude_outside`) dropped
//! and the other weights renormalized. Output sizes are `⌊in·scale⌋`, or
//! the `sizes` input.

use super::emit::{Attr, Emit};
use super::{attr_i, attr_ints, attr_s, data_io, input, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::attr::attr_f;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// Weights of the `taps` neighbours of a sample at fraction `t` past the
/// left one (linear: 2 taps; cubic: 4, with coefficient `a`).
fn weights(t: f64, cubic: Option<f64>) -> Vec<f64> {
    let Some(a) = cubic else {
        return vec![1.0 - t, t];
    };
    let near = |d: f64| ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
    let far = |d: f64| ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
    vec![far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// The `[output, input]` interpolation matrix of one axis whose resized
/// length is `length` (`input · scale`, before rounding down to `output`).
fn matrix(
    input: usize,
    output: usize,
    length: f64,
    cubic: Option<f64>,
    exclude_outside: bool,
) -> Vec<f64> {
    let mut m = vec![0.0; output * input];
    let taps: i64 = if cubic.is_some() { 4 } else { 2 };
    let last = input as i64 - 1;
    for o in 0..output {
        let x = if length == 1.0 {
            0.0
        } else {
            o as f64 * last as f64 / (length - 1.0)
        };
        let left = x.floor();
        let mut w = weights(x - left, cubic);
        let first = left as i64 - (taps / 2 - 1);
        let outside = |k: usize| {
            let i = first + k as i64;
            i < 0 || i > last
        };
        if exclude_outside {
            for (k, wk) in w.iter_mut().enumerate() {
                if outside(k) {
                    *wk = 0.0;
                }
            }
            let sum: f64 = w.iter().sum();
            if sum != 0.0 {
                w.iter_mut().for_each(|wk| *wk /= sum);
            }
        }
        for (k, wk) in w.iter().enumerate() {
            let i = (first + k as i64).clamp(0, last) as usize;
            m[o * input + i] += wk;
        }
    }
    m
}

/// Output sizes and unrounded lengths (`in · scale`) from the constant
/// `scales` (input 2) or `sizes` (input 3), over `axes` (every axis by
/// default).
fn output_sizes(
    node: &NodeProto,
    ctx: &Context,
    shape: &[i64],
) -> Result<(Vec<i64>, Vec<f64>), Declined> {
    let rank = shape.len() as i64;
    let axes: Vec<usize> = match attr_ints(node, "axes") {
        Some(a) => a
            .iter()
            .map(|&d| {
                usize::try_from(if d < 0 { d + rank } else { d }).map_err(|_| invalid("bad axes"))
            })
            .collect::<Result<_, _>>()?,
        None => (0..shape.len()).collect(),
    };
    let mut out = shape.to_vec();
    let mut lengths: Vec<f64> = shape.iter().map(|&d| d as f64).collect();
    if let Some(sizes) = input(node, 3) {
        if attr_s(node, "keep_aspect_ratio_policy").is_some_and(|p| p != "stretch") {
            return Err(unsupported("keep_aspect_ratio_policy other than stretch"));
        }
        let sizes = ctx
            .const_ints(sizes)
            .ok_or_else(|| unknown("sizes not constant"))?;
        if sizes.len() != axes.len() {
            return Err(invalid("sizes do not match the axes"));
        }
        for (&a, &s) in axes.iter().zip(&sizes) {
            *out.get_mut(a).ok_or_else(|| invalid("axis out of range"))? = s;
            lengths[a] = s as f64;
        }
    } else {
        let scales = input(node, 2).ok_or_else(|| invalid("neither scales nor sizes"))?;
        let scales = ctx
            .const_floats(scales)
            .ok_or_else(|| unknown("scales not constant"))?;
        if scales.len() != axes.len() {
            return Err(invalid("scales do not match the axes"));
        }
        for (&a, &s) in axes.iter().zip(&scales) {
            let d = out.get_mut(a).ok_or_else(|| invalid("axis out of range"))?;
            lengths[a] = *d as f64 * s;
            *d = lengths[a].floor() as i64;
        }
    }
    if out.iter().any(|&d| d < 1) {
        return Err(invalid(format!("an empty output {out:?}")));
    }
    Ok((out, lengths))
}

pub(super) fn align_corners_by_matrices(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let cubic = match attr_s(node, "mode").unwrap_or("nearest") {
        "linear" => None,
        "cubic" => Some(f64::from(attr_f(node, "cubic_coeff_a").unwrap_or(-0.75))),
        other => return Err(unsupported(format!("mode {other}"))),
    };
    if attr_s(node, "coordinate_transformation_mode") != Some("align_corners") {
        return Err(native(
            "coordinate_transformation_mode other than align_corners",
        ));
    }
    if attr_i(node, "antialias").unwrap_or(0) != 0 {
        return Err(unsupported("antialias"));
    }
    if ctx.opset < 11 {
        return Err(unsupported("Resize before opset 11 has no align_corners"));
    }
    let exclude_outside = attr_i(node, "exclude_outside").unwrap_or(0) != 0;
    let elem = ctx.input_elem(x)?;
    let shape = ctx
        .static_shape(x)
        .ok_or_else(|| unknown("input shape not static"))?;
    let (sizes, lengths) = output_sizes(node, ctx, &shape)?;
    let rank = shape.len();
    let mut current = x.to_string();
    let resized: Vec<usize> = (0..rank).filter(|&a| sizes[a] != shape[a]).collect();
    if resized.is_empty() {
        emit.op_into("Identity", &[x], &[], &[Some(y)]);
        return Ok(());
    }
    for (k, &a) in resized.iter().enumerate() {
        let (n_in, n_out) = (shape[a] as usize, sizes[a] as usize);
        // Transposed, [input, output], for `x · Mᵀ` over the last axis.
        let m = matrix(n_in, n_out, lengths[a], cubic, exclude_outside);
        let mt: Vec<f64> = (0..n_in * n_out)
            .map(|j| m[(j % n_out) * n_in + j / n_out])
            .collect();
        let weights = match elem {
            ElemType::FLOAT => {
                let v: Vec<f32> = mt.iter().map(|&w| w as f32).collect();
                emit.constant::<f32>(&[n_in, n_out], &v)?
            }
            ElemType::DOUBLE => emit.constant::<f64>(&[n_in, n_out], &mt)?,
            other => return Err(unsupported(format!("input of type {other}"))),
        };
        let target = (k + 1 == resized.len()).then_some(y);
        current = if a + 1 == rank {
            emit.op_into("MatMul", &[&current, &weights], &[], &[target])
                .remove(0)
        } else {
            let mut perm: Vec<i64> = (0..rank as i64).collect();
            perm.swap(a, rank - 1);
            let moved = emit.op(
                "Transpose",
                &[&current],
                &[Attr::Ints("perm", perm.clone())],
            );
            let product = emit.op("MatMul", &[&moved, &weights], &[]);
            emit.op_into(
                "Transpose",
                &[&product],
                &[Attr::Ints("perm", perm)],
                &[target],
            )
            .remove(0)
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::matrix;

    #[test]
    fn interpolation_rows_sum_to_one_and_corners_align() {
        for cubic in [None, Some(-0.75), Some(-0.5)] {
            for exclude in [false, true] {
                let m = matrix(4, 3, 3.0, cubic, exclude);
                for row in m.chunks(4) {
                    let sum: f64 = row.iter().sum();
                    assert!((sum - 1.0).abs() < 1e-12, "{row:?}");
                }
                // align_corners: the first and last outputs are the corners.
                assert_eq!(&m[0..4], &[1.0, 0.0, 0.0, 0.0]);
                assert_eq!(&m[8..12], &[0.0, 0.0, 0.0, 1.0]);
            }
        }
        // Linear, 4 → 3: the middle output sits at 1.5.
        assert_eq!(&matrix(4, 3, 3.0, None, false)[4..8], &[0.0, 0.5, 0.5, 0.0]);
        // 4 → 2.4 (scale 0.6), 2 outputs: the second samples 3/1.4.
        let m = matrix(4, 2, 2.4, None, false);
        let x: f64 = 3.0 / 1.4;
        assert!((m[4 + 2] - (3.0 - x)).abs() < 1e-12 && (m[4 + 3] - (x - 2.0)).abs() < 1e-12);
    }
}

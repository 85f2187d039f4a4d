//! Resize of the last two axes of a 4-D tensor: nearest (four rounding
//! modes) or linear, with the half_pixel, asymmetric, align_corners and
//! pytorch_half_pixel coordinate transformations; scales or sizes given as
//! constants.

use tessera_common::declined::{invalid, unknown, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;

use super::{attr_i, attr_s, input, unknown_attrs};
use crate::plugins::gpu::builder::{groups_1d, Builder};

pub fn check(node: &NodeProto, opset: i64) -> Result<(), Declined> {
    unknown_attrs(
        node,
        &[
            "mode",
            "coordinate_transformation_mode",
            "nearest_mode",
            "cubic_coeff_a",
            "exclude_outside",
            "extrapolation_value",
            "antialias",
            "keep_aspect_ratio_policy",
        ],
    )?;
    match attr_s(node, "mode") {
        None | Some("nearest") | Some("linear") => {}
        Some(other) => return Err(unsupported(format!("mode '{other}'"))),
    }
    if opset >= 11 {
        coord(node)?;
        nearest(node)?;
    }
    if attr_i(node, "exclude_outside").unwrap_or(0) != 0
        || attr_i(node, "antialias").unwrap_or(0) != 0
    {
        return Err(unsupported("exclude_outside / antialias"));
    }
    match attr_s(node, "keep_aspect_ratio_policy") {
        None | Some("stretch") => Ok(()),
        Some(other) => Err(unsupported(format!("keep_aspect_ratio_policy '{other}'"))),
    }
}

fn coord(node: &NodeProto) -> Result<u32, Declined> {
    Ok(match attr_s(node, "coordinate_transformation_mode") {
        None | Some("half_pixel") => 0,
        Some("asymmetric") => 1,
        Some("align_corners") => 2,
        Some("pytorch_half_pixel") => 3,
        Some(other) => {
            return Err(unsupported(format!(
                "coordinate_transformation_mode '{other}'"
            )))
        }
    })
}

fn nearest(node: &NodeProto) -> Result<u32, Declined> {
    Ok(match attr_s(node, "nearest_mode") {
        None | Some("round_prefer_floor") => 0,
        Some("round_prefer_ceil") => 1,
        Some("floor") => 2,
        Some("ceil") => 3,
        Some(other) => return Err(unsupported(format!("nearest_mode '{other}'"))),
    })
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let sx = b.shape(x)?;
    if sx.len() != 4 {
        return Err(unsupported(format!(
            "input of rank {} (4-D only)",
            sx.len()
        )));
    }
    // Opset 10: (X, scales); 11+: (X, roi, scales, sizes).
    let (scales_at, sizes_at) = if b.opset < 11 {
        (1, usize::MAX)
    } else {
        (2, 3)
    };
    let scales = match input(node, scales_at) {
        Some(name) => Some(
            b.floats(name)
                .ok_or_else(|| unknown("scales must be a constant"))?,
        ),
        None => None,
    }
    .filter(|s| !s.is_empty());
    let sizes = match input(node, sizes_at) {
        Some(name) => Some(
            b.ints(name)
                .ok_or_else(|| unknown("sizes must be a constant"))?,
        ),
        None => None,
    }
    .filter(|s| !s.is_empty());
    let (out, scale) = match (scales, sizes) {
        (Some(s), None) if s.len() == 4 => {
            let out: Vec<usize> = sx
                .iter()
                .zip(&s)
                .map(|(&d, &f)| (d as f32 * f).floor() as usize)
                .collect();
            (out, s)
        }
        (None, Some(z)) if z.len() == 4 && z.iter().all(|&v| v >= 0) => {
            let out: Vec<usize> = z.iter().map(|&v| v as usize).collect();
            let s = sx
                .iter()
                .zip(&out)
                .map(|(&d, &o)| o as f32 / d.max(1) as f32)
                .collect();
            (out, s)
        }
        _ => return Err(invalid("needs four scales or four sizes")),
    };
    if out[0] != sx[0] || out[1] != sx[1] {
        return Err(unsupported("resizing the batch or channel axes"));
    }
    let mode = u32::from(attr_s(node, "mode") == Some("linear"));
    let (coord, nearest) = if b.opset < 11 {
        (1, 2)
    } else {
        (coord(node)?, nearest(node)?)
    };
    let total: usize = out.iter().product();
    // Source rows and columns computed here, in IEEE f32 like the CPU
    // runtimes (a GPU may divide through an approximate reciprocal, and
    // the nearest modes must see exact ties as ties).
    let mut params = vec![
        (sx[0] * sx[1]) as u32,
        sx[2] as u32,
        sx[3] as u32,
        out[2] as u32,
        out[3] as u32,
        mode,
        total as u32,
    ];
    for axis in [2, 3] {
        for o in 0..out[axis] {
            let at = source(o, sx[axis], out[axis], scale[axis], coord);
            params.extend(taps(at, sx[axis], mode == 1, nearest));
        }
    }
    let xs = b.slot(x)?;
    let ys = b.output(&node.output[0], out)?;
    b.dispatch("resize", &[xs, ys], &params, groups_1d(total))
}

/// The input coordinate of output index `o` on an axis of `in_len` resized
/// to `out_len` by `scale`.
fn source(o: usize, in_len: usize, out_len: usize, scale: f32, coord: u32) -> f32 {
    let fo = o as f32;
    match coord {
        1 => fo / scale,
        2 => {
            // The spec's length_resized is length_original * scale (not
            // rounded down) when scales are given.
            let resized = in_len as f32 * scale;
            if resized <= 1.0 {
                0.0
            } else {
                fo * (in_len - 1) as f32 / (resized - 1.0)
            }
        }
        3 if out_len == 1 => 0.0,
        _ => (fo + 0.5) / scale - 0.5,
    }
}

/// (first, second, weight of the second) input index at coordinate `at`:
/// the two neighbours for linear, the rounded index (weight 0) for nearest.
fn taps(at: f32, in_len: usize, linear: bool, nearest: u32) -> [u32; 3] {
    let last = in_len.saturating_sub(1) as f32;
    if linear {
        let c = at.clamp(0.0, last);
        let i0 = c.floor();
        let i1 = (i0 + 1.0).min(last);
        return [i0 as u32, i1 as u32, (c - i0).to_bits()];
    }
    let tie = at - at.floor() == 0.5;
    let i = match nearest {
        1 if tie => at.ceil(),
        2 => at.floor(),
        3 => at.ceil(),
        1 => at.round(),
        _ if tie => at.floor(),
        _ => at.round(),
    };
    let i = i.clamp(0.0, last) as u32;
    [i, i, 0]
}

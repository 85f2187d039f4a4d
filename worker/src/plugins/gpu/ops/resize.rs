//! Resize of the last two axes of a 4-D tensor: nearest (four rounding
//! modes) or linear, with the half_pixel, asymmetric, align_corners and
//! pytorch_half_pixel coordinate transformations; scales or sizes given as
//! constants.

use tessera_common::onnx::proto::NodeProto;

use super::{attr_i, attr_s, input, unknown_attrs};
use crate::plugins::gpu::program::{groups_1d, Builder};

pub fn check(node: &NodeProto, opset: i64) -> Result<(), String> {
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
    match attr_s(node, "mode").as_deref() {
        None | Some("nearest") | Some("linear") => {}
        Some(other) => return Err(format!("mode '{other}'")),
    }
    if opset >= 11 {
        coord(node)?;
        nearest(node)?;
    }
    if attr_i(node, "exclude_outside").unwrap_or(0) != 0
        || attr_i(node, "antialias").unwrap_or(0) != 0
    {
        return Err("exclude_outside / antialias".into());
    }
    match attr_s(node, "keep_aspect_ratio_policy").as_deref() {
        None | Some("stretch") => Ok(()),
        Some(other) => Err(format!("keep_aspect_ratio_policy '{other}'")),
    }
}

fn coord(node: &NodeProto) -> Result<u32, String> {
    Ok(
        match attr_s(node, "coordinate_transformation_mode").as_deref() {
            None | Some("half_pixel") => 0,
            Some("asymmetric") => 1,
            Some("align_corners") => 2,
            Some("pytorch_half_pixel") => 3,
            Some(other) => return Err(format!("coordinate_transformation_mode '{other}'")),
        },
    )
}

fn nearest(node: &NodeProto) -> Result<u32, String> {
    Ok(match attr_s(node, "nearest_mode").as_deref() {
        None | Some("round_prefer_floor") => 0,
        Some("round_prefer_ceil") => 1,
        Some("floor") => 2,
        Some("ceil") => 3,
        Some(other) => return Err(format!("nearest_mode '{other}'")),
    })
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), String> {
    let x = input(node, 0).ok_or("no input")?;
    let sx = b.shape(x)?;
    if sx.len() != 4 {
        return Err(format!("input of rank {} (4-D only)", sx.len()));
    }
    // Opset 10: (X, scales); 11+: (X, roi, scales, sizes).
    let (scales_at, sizes_at) = if b.opset < 11 {
        (1, usize::MAX)
    } else {
        (2, 3)
    };
    let scales = match input(node, scales_at) {
        Some(name) => Some(b.floats(name).ok_or("scales must be a constant")?),
        None => None,
    }
    .filter(|s| !s.is_empty());
    let sizes = match input(node, sizes_at) {
        Some(name) => Some(b.ints(name).ok_or("sizes must be a constant")?),
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
        _ => return Err("needs four scales or four sizes".into()),
    };
    if out[0] != sx[0] || out[1] != sx[1] {
        return Err("resizing the batch or channel axes".into());
    }
    let mode = u32::from(attr_s(node, "mode").as_deref() == Some("linear"));
    let (coord, nearest) = if b.opset < 11 {
        (1, 2)
    } else {
        (coord(node)?, nearest(node)?)
    };
    let total: usize = out.iter().product();
    let params = [
        (sx[0] * sx[1]) as u32,
        sx[2] as u32,
        sx[3] as u32,
        out[2] as u32,
        out[3] as u32,
        mode,
        coord,
        nearest,
        scale[2].to_bits(),
        scale[3].to_bits(),
        total as u32,
    ];
    let xs = b.slot(x)?;
    let ys = b.output(&node.output[0], out)?;
    b.dispatch("resize", &[xs, ys], &params, groups_1d(total))
}

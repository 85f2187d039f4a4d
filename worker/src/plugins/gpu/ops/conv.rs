//! Conv (1-D and 2-D, groups, strides, dilations, pads, auto_pad) and
//! pooling (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool).

use tessera_common::declined::{invalid, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;

use super::{attr_i, attr_ints, attr_s, input, unknown_attrs};
use crate::plugins::gpu::builder::{groups_1d, Builder};

pub fn check(node: &NodeProto) -> Result<(), Declined> {
    match node.op_type() {
        "Conv" => unknown_attrs(
            node,
            &[
                "auto_pad",
                "dilations",
                "group",
                "kernel_shape",
                "pads",
                "strides",
            ],
        ),
        "MaxPool" => {
            if node.output.iter().filter(|o| !o.is_empty()).count() > 1 {
                return Err(unsupported("the Indices output"));
            }
            if attr_i(node, "storage_order").unwrap_or(0) != 0 {
                return Err(unsupported("storage_order 1"));
            }
            unknown_attrs(
                node,
                &[
                    "auto_pad",
                    "ceil_mode",
                    "dilations",
                    "kernel_shape",
                    "pads",
                    "strides",
                    "storage_order",
                ],
            )
        }
        "ConvTranspose" => {
            if attr_ints(node, "output_shape").is_some() {
                return Err(unsupported("output_shape"));
            }
            if !matches!(attr_s(node, "auto_pad"), None | Some("NOTSET")) {
                return Err(unsupported("auto_pad"));
            }
            unknown_attrs(
                node,
                &[
                    "auto_pad",
                    "dilations",
                    "group",
                    "kernel_shape",
                    "output_padding",
                    "pads",
                    "strides",
                ],
            )
        }
        "AveragePool" => unknown_attrs(
            node,
            &[
                "auto_pad",
                "ceil_mode",
                "count_include_pad",
                "dilations",
                "kernel_shape",
                "pads",
                "strides",
            ],
        ),
        _ => unknown_attrs(node, &[]),
    }?;
    match attr_s(node, "auto_pad") {
        None | Some("NOTSET") | Some("VALID") | Some("SAME_UPPER") | Some("SAME_LOWER") => Ok(()),
        Some(other) => Err(unsupported(format!("auto_pad '{other}'"))),
    }
}

/// Output size and (begin, end) padding of one spatial axis.
fn axis_out(
    node: &NodeProto,
    size: usize,
    k: usize,
    s: usize,
    d: usize,
    pads: (usize, usize),
    ceil: bool,
) -> Result<(usize, usize, usize), Declined> {
    if size == 0 || k == 0 || s == 0 {
        return Err(invalid("an empty input, kernel or stride"));
    }
    let eff = d * (k - 1) + 1;
    match attr_s(node, "auto_pad") {
        Some("SAME_UPPER") | Some("SAME_LOWER") => {
            let out = size.div_ceil(s);
            let total = ((out - 1) * s + eff).saturating_sub(size);
            let (small, big) = (total / 2, total - total / 2);
            let (b, e) = if attr_s(node, "auto_pad") == Some("SAME_UPPER") {
                (small, big)
            } else {
                (big, small)
            };
            Ok((out, b, e))
        }
        Some("VALID") => {
            if size < eff {
                return Err(invalid("kernel larger than the input"));
            }
            Ok(((size - eff) / s + 1, 0, 0))
        }
        _ => {
            let padded = size + pads.0 + pads.1;
            if padded < eff {
                return Err(invalid("kernel larger than the padded input"));
            }
            let mut out = if ceil {
                (padded - eff).div_ceil(s) + 1
            } else {
                (padded - eff) / s + 1
            };
            // A last window must start inside the input or its begin padding.
            if ceil && (out - 1) * s >= size + pads.0 {
                out -= 1;
            }
            Ok((out, pads.0, pads.1))
        }
    }
}

/// An NC(H)W input as (N, C, H, W): 1-D as 2-D with H = 1.
fn nchw(sx: &[usize]) -> Result<(usize, usize, usize, usize), Declined> {
    match *sx {
        [n, c, h, w] => Ok((n, c, h, w)),
        [n, c, w] => Ok((n, c, 1, w)),
        _ => Err(unsupported(format!(
            "input of rank {} (1-D and 2-D only)",
            sx.len()
        ))),
    }
}

/// A per-axis attribute (strides, dilations, output_padding) as (H, W);
/// 1-D nodes give H the default.
fn pair(
    node: &NodeProto,
    name: &str,
    spatial: usize,
    default: usize,
    min: i64,
) -> Result<(usize, usize), Declined> {
    match attr_ints(node, name) {
        Some(v) if v.len() == spatial && v.iter().all(|&x| x >= min) => Ok(if spatial == 2 {
            (v[0] as usize, v[1] as usize)
        } else {
            (default, v[0] as usize)
        }),
        Some(_) => Err(invalid(format!("bad {name}"))),
        None => Ok((default, default)),
    }
}

/// `pads` as [(top, bottom), (left, right)].
fn pads(node: &NodeProto, spatial: usize) -> Result<[(usize, usize); 2], Declined> {
    match attr_ints(node, "pads") {
        Some(p) if p.len() == 2 * spatial && p.iter().all(|&v| v >= 0) => {
            let p: Vec<usize> = p.iter().map(|&v| v as usize).collect();
            Ok(if spatial == 2 {
                [(p[0], p[2]), (p[1], p[3])]
            } else {
                [(0, 0), (p[0], p[1])]
            })
        }
        Some(_) => Err(invalid("bad pads")),
        None => Ok([(0, 0), (0, 0)]),
    }
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    if node.op_type() == "ConvTranspose" {
        return conv_transpose(b, node);
    }
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let sx = b.shape(x)?;
    let (n, c, h, w) = nchw(&sx)?;
    let spatial = sx.len() - 2;
    let global = node.op_type().starts_with("Global");
    let (kh, kw, kernel) = if node.op_type() == "Conv" {
        let wname = input(node, 1).ok_or_else(|| invalid("no weights"))?;
        let sw = b.shape(wname)?;
        if sw.len() != sx.len() {
            return Err(invalid("weights and input ranks differ"));
        }
        (
            if spatial == 2 { sw[2] } else { 1 },
            sw[sw.len() - 1],
            Some(sw),
        )
    } else if global {
        (h, w, None)
    } else {
        let k = attr_ints(node, "kernel_shape").ok_or_else(|| invalid("no kernel_shape"))?;
        if k.len() != spatial || k.iter().any(|&v| v < 1) {
            return Err(invalid("bad kernel_shape"));
        }
        (
            if spatial == 2 { k[0] as usize } else { 1 },
            k[spatial - 1] as usize,
            None,
        )
    };
    let (sh, sw_) = if global {
        (1, 1)
    } else {
        pair(node, "strides", spatial, 1, 1)?
    };
    let (dh, dw) = if global {
        (1, 1)
    } else {
        pair(node, "dilations", spatial, 1, 1)?
    };
    let pads = pads(node, spatial)?;
    let ceil = attr_i(node, "ceil_mode").unwrap_or(0) != 0;
    let (oh, pt, pb) = axis_out(node, h, kh, sh, dh, pads[0], ceil)?;
    let (ow, pl, pr) = axis_out(node, w, kw, sw_, dw, pads[1], ceil)?;
    let xs = b.slot(x)?;
    if let Some(sw) = kernel {
        let m = sw[0];
        let group = attr_i(node, "group").unwrap_or(1).max(1) as usize;
        if c % group != 0 || m % group != 0 || sw[1] * group != c {
            return Err(unsupported(format!(
                "weights {sw:?} do not fit {c} channels in {group} groups"
            )));
        }
        let shape = [
            n, c, h, w, m, oh, ow, kh, kw, group, sh, sw_, dh, dw, pt, pl,
        ];
        return launch(b, node, "conv", xs, spatial, shape);
    }
    let mut out = vec![n, c];
    if spatial == 2 {
        out.push(oh);
    }
    out.push(ow);
    let total = n * c * oh * ow;
    let ys = b.output(&node.output[0], out)?;
    let mode = if node.op_type().contains("Max") { 0 } else { 1 };
    if global {
        let params = [(n * c) as u32, (h * w) as u32, mode as u32];
        let groups = ((n * c).clamp(1, 65535) as u32, 1, 1);
        return b.dispatch("global_pool", &[xs, ys], &params, groups);
    }
    let include_pad = attr_i(node, "count_include_pad").unwrap_or(0) as usize;
    let params = [
        n * c,
        h,
        w,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw_,
        dh,
        dw,
        pt,
        pl,
        mode,
        include_pad,
        pb,
        pr,
        total,
    ]
    .map(|v| v as u32);
    b.dispatch("pool", &[xs, ys], &params, groups_1d(total))
}

/// ConvTranspose: output (in - 1)·s + (k - 1)·d + 1 - pads + output_padding.
fn conv_transpose(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let wname = input(node, 1).ok_or_else(|| invalid("no weights"))?;
    let (sx, sw) = (b.shape(x)?, b.shape(wname)?);
    let (n, c, h, w) = nchw(&sx)?;
    if sw.len() != sx.len() {
        return Err(invalid("weights and input ranks differ"));
    }
    let spatial = sx.len() - 2;
    let (kh, kw) = if spatial == 2 {
        (sw[2], sw[3])
    } else {
        (1, sw[2])
    };
    let group = attr_i(node, "group").unwrap_or(1).max(1) as usize;
    if sw[0] != c || c % group != 0 {
        return Err(unsupported(format!(
            "weights {sw:?} do not fit {c} channels in {group} groups"
        )));
    }
    let m = sw[1] * group;
    let (sh, sw_) = pair(node, "strides", spatial, 1, 1)?;
    let (dh, dw) = pair(node, "dilations", spatial, 1, 1)?;
    let (oph, opw) = pair(node, "output_padding", spatial, 0, 0)?;
    let [(pt, pb), (pl, pr)] = pads(node, spatial)?;
    if h == 0 || w == 0 || kh == 0 || kw == 0 {
        return Err(invalid("an empty input or kernel"));
    }
    let size = |i: usize, s: usize, k: usize, d: usize, b0: usize, b1: usize, op: usize| {
        ((i - 1) * s + (k - 1) * d + 1 + op).checked_sub(b0 + b1)
    };
    let oh =
        size(h, sh, kh, dh, pt, pb, oph).ok_or_else(|| invalid("pads larger than the output"))?;
    let ow =
        size(w, sw_, kw, dw, pl, pr, opw).ok_or_else(|| invalid("pads larger than the output"))?;
    let xs = b.slot(x)?;
    let shape = [
        n, c, h, w, m, oh, ow, kh, kw, group, sh, sw_, dh, dw, pt, pl,
    ];
    launch(b, node, "convtranspose", xs, spatial, shape)
}

/// Launches `kernel` (conv or convtranspose) on input slot `xs`, the
/// node's weights and optional bias; `shape` is [N, C, H, W, M, OH, OW,
/// KH, KW, group, sh, sw, dh, dw, pt, pl].
fn launch(
    b: &mut Builder,
    node: &NodeProto,
    kernel: &str,
    xs: usize,
    spatial: usize,
    shape: [usize; 16],
) -> Result<(), Declined> {
    let [n, _, _, _, m, oh, ow, ..] = shape;
    let ws = b.slot(input(node, 1).ok_or_else(|| invalid("no weights"))?)?;
    let (bs, has_bias) = match input(node, 2) {
        Some(bias) => (b.slot(bias)?, 1),
        None => (ws, 0),
    };
    let mut out = vec![n, m];
    if spatial == 2 {
        out.push(oh);
    }
    out.push(ow);
    let total = n * m * oh * ow;
    let ys = b.output(&node.output[0], out)?;
    let mut params: Vec<u32> = shape.iter().map(|&v| v as u32).collect();
    params.extend([has_bias, total as u32]);
    // Convs with many output channels per group run as an implicit GEMM
    // (64x64 tiles of channels x positions per workgroup, one z per image
    // and group); depthwise and other thin ones run direct.
    let group = shape[9];
    let tiles = ((oh * ow).div_ceil(64), (m / group).div_ceil(64), n * group);
    if kernel == "conv"
        && m / group >= GEMM_MIN_CHANNELS
        && tiles.0.max(tiles.1).max(tiles.2) <= 65535
    {
        let [_, c, _, _, _, _, _, kh, kw, ..] = shape;
        let steps = (c / group * kh * kw).div_ceil(16);
        let splits = split_k(tiles.0 * tiles.1 * tiles.2, steps, tiles.2);
        let per_split = steps.div_ceil(splits);
        let splits = steps.div_ceil(per_split);
        params.extend([splits as u32, (per_split * 16) as u32]);
        let groups = (tiles.0 as u32, tiles.1 as u32, (tiles.2 * splits) as u32);
        if splits == 1 {
            return b.dispatch("conv_gemm", &[xs, ws, bs, ys], &params, groups);
        }
        let partial = format!("{}#partial", node.output[0]);
        let ps = b.output(&partial, vec![splits, total])?;
        b.dispatch("conv_gemm", &[xs, ws, bs, ps], &params, groups)?;
        let sum = [total, splits, oh * ow, m, has_bias as usize].map(|v| v as u32);
        return b.dispatch("conv_splitk", &[ps, bs, ys], &sum, groups_1d(total));
    }
    b.dispatch(kernel, &[xs, ws, bs, ys], &params, groups_1d(total))
}

/// How many ranges of k a GEMM conv of `tiles` workgroups (`images` of
/// them along z) splits into: thin convs (few positions or channels, a
/// long k) would leave most of a large GPU idle, each workgroup walking
/// all of k. Aims at 256 workgroups, each with at least 4 k-steps.
fn split_k(tiles: usize, steps: usize, images: usize) -> usize {
    if tiles >= 256 {
        return 1;
    }
    (256 / tiles).min(steps / 4).min(65535 / images).max(1)
}

/// Output channels per group from which a Conv runs as an implicit GEMM.
const GEMM_MIN_CHANNELS: usize = 16;

//! LpPool as an average pool of `|x|^p`:
//! `LpPool(x) = (AveragePool(|x|^p, count_include_pad) · prod(kernel))^(1/p)`
//! (zero padding adds nothing to the sum, and with `count_include_pad` the
//! average divides every window by the kernel size).

use super::emit::{Attr, Emit};
use super::{attr, attr_i, attr_ints, attr_s, data_io, input, output, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

pub(super) fn lp_pool(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let elem = ctx.input_elem(x)?;
    let kernel = attr_ints(node, "kernel_shape").ok_or_else(|| invalid("no kernel_shape"))?;
    let p = attr_i(node, "p").unwrap_or(2);
    if p < 1 {
        return Err(unsupported(format!("p = {p}")));
    }
    let window: i64 = kernel.iter().product();
    let mut pool = vec![
        Attr::Ints("kernel_shape", kernel.to_vec()),
        Attr::Int("count_include_pad", 1),
    ];
    if let Some(s) = attr_ints(node, "strides") {
        pool.push(Attr::Ints("strides", s.to_vec()));
    }
    if let Some(pads) = attr_ints(node, "pads") {
        pool.push(Attr::Ints("pads", pads.to_vec()));
    }
    if let Some(a) = attr_s(node, "auto_pad") {
        pool.push(Attr::Str("auto_pad", a));
    }
    if attr(node, "ceil_mode").is_some() {
        pool.push(Attr::Int(
            "ceil_mode",
            attr_i(node, "ceil_mode").unwrap_or(0),
        ));
    }
    let dilated = attr_ints(node, "dilations").is_some_and(|d| d.iter().any(|&d| d != 1));
    let abs = emit.op("Abs", &[x], &[]);
    let pc = emit.float_scalar(p as f32, elem)?;
    let powed = emit.op("Pow", &[&abs, &pc], &[]);
    let sum = if dilated {
        // tract's pools are wrong with dilations: sum with a Conv.
        let dims = ctx.input_shape(x)?;
        Window::of(node, &dims)?.sum(emit, &powed, dims[1], elem)?
    } else {
        let avg = emit.op("AveragePool", &[&powed], &pool);
        let wc = emit.float_scalar(window as f32, elem)?;
        emit.op("Mul", &[&avg, &wc], &[])
    };
    let inv = emit.float_scalar(1.0 / p as f32, elem)?;
    emit.op_into("Pow", &[&sum, &inv], &[], &[Some(y)]);
    Ok(())
}

/// MaxUnpool: the values scattered to their (flat) indices in a zero tensor
/// of the inferred shape, zero-padded at the end to `output_shape` when it
/// is given (the indices refer to the inferred shape).
pub(super) fn max_unpool(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let indices = input(node, 1).ok_or_else(|| invalid("no indices"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let elem = ctx.input_elem(x)?;
    let dims = ctx.input_shape(x)?;
    let kernel = attr_ints(node, "kernel_shape").ok_or_else(|| invalid("no kernel_shape"))?;
    let n = kernel.len();
    if dims.len() != n + 2 {
        return Err(invalid("kernel rank does not match the input"));
    }
    let strides = attr_ints(node, "strides").map(<[i64]>::to_vec);
    let strides = strides.unwrap_or_else(|| vec![1; n]);
    let pads = attr_ints(node, "pads").map(<[i64]>::to_vec);
    let pads = pads.unwrap_or_else(|| vec![0; 2 * n]);
    if strides.len() != n || pads.len() != 2 * n {
        return Err(invalid("strides or pads of the wrong length"));
    }
    let mut inferred = dims[..2].to_vec();
    for d in 0..n {
        inferred.push((dims[d + 2] - 1) * strides[d] - pads[d] - pads[n + d] + kernel[d]);
    }
    let wanted = match input(node, 2) {
        Some(shape) => ctx
            .const_ints(shape)
            .ok_or_else(|| unknown("output_shape is not a constant"))?,
        None => inferred.clone(),
    };
    if wanted.len() != inferred.len() || wanted.iter().zip(&inferred).any(|(w, i)| w < i) {
        return Err(invalid("output_shape smaller than the inferred shape"));
    }
    if inferred.iter().any(|&d| d < 1) {
        return Err(invalid("empty output"));
    }
    let total: i64 = inferred.iter().product();
    let flat = emit.constant::<i64>(&[1], &[-1])?;
    let values = emit.op("Reshape", &[x, &flat], &[]);
    let at = emit.op("Reshape", &[indices, &flat], &[]);
    let zero = emit.float_scalar(0.0, elem)?;
    let size = emit.constant::<i64>(&[1], &[total])?;
    let zeros = emit.op("Expand", &[&zero, &size], &[]);
    let scattered = emit.op(
        "ScatterElements",
        &[&zeros, &at, &values],
        &[Attr::Int("axis", 0)],
    );
    let shape = emit.constant::<i64>(&[inferred.len()], &inferred)?;
    if wanted == inferred {
        emit.op_into("Reshape", &[&scattered, &shape], &[], &[Some(y)]);
    } else {
        let shaped = emit.op("Reshape", &[&scattered, &shape], &[]);
        let mut p = vec![0; wanted.len()];
        p.extend(wanted.iter().zip(&inferred).map(|(w, i)| w - i));
        let p = emit.constant::<i64>(&[p.len()], &p)?;
        emit.op_into("Pad", &[&shaped, &p], &[], &[Some(y)]);
    }
    Ok(())
}

/// AveragePool with dilations (tract's is wrong): a depthwise Conv with a
/// ones kernel, times a constant `1 / count` per output position.
pub(super) fn dilated_average_pool(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    if attr_ints(node, "dilations").is_none_or(|d| d.iter().all(|&d| d == 1)) {
        return Err(native("no dilations: runs natively"));
    }
    let (x, y) = data_io(node)?;
    let elem = ctx.input_elem(x)?;
    let dims = ctx.input_shape(x)?;
    let include_pad = attr_i(node, "count_include_pad").unwrap_or(0) != 0;
    let window = Window::of(node, &dims)?;
    let scale = window.inverse_counts(&dims, include_pad)?;
    let sdims: Vec<usize> = window.out.iter().map(|&o| o as usize).collect();
    let s = emit.constant::<f32>(&sdims, &scale)?;
    let s = emit.from_f32(s, elem);
    let sum = window.sum(emit, x, dims[1], elem)?;
    emit.op_into("Mul", &[&sum, &s], &[], &[Some(y)]);
    Ok(())
}

/// A pooling window with explicit padding. Output shape, and the extra
/// padding of `ceil_mode` (split between both ends), follow the ONNX
/// reference implementation.
struct Window {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    /// Padding including the extra padding of `ceil_mode`.
    pads: Vec<i64>,
    out: Vec<i64>,
}

impl Window {
    fn of(node: &NodeProto, dims: &[i64]) -> Result<Window, Declined> {
        let kernel = attr_ints(node, "kernel_shape")
            .ok_or_else(|| invalid("no kernel_shape"))?
            .to_vec();
        let n = kernel.len();
        let ones = vec![1; n];
        let dilations = attr_ints(node, "dilations").map_or(ones.clone(), <[i64]>::to_vec);
        let strides = attr_ints(node, "strides").map_or(ones, <[i64]>::to_vec);
        let mut pads = attr_ints(node, "pads").map_or(vec![0; 2 * n], <[i64]>::to_vec);
        if dims.len() != n + 2 || dilations.len() != n || strides.len() != n || pads.len() != 2 * n
        {
            return Err(invalid("kernel rank does not match the input"));
        }
        if strides
            .iter()
            .chain(&dilations)
            .chain(&kernel)
            .any(|&s| s < 1)
        {
            return Err(invalid("bad kernel, strides or dilations"));
        }
        if attr_s(node, "auto_pad").is_some_and(|a| a != "NOTSET") {
            return Err(unsupported("auto_pad"));
        }
        let ceil = attr_i(node, "ceil_mode").unwrap_or(0) != 0;
        let spatial = &dims[2..];
        let mut out = Vec::with_capacity(n);
        for d in 0..n {
            let window = (kernel[d] - 1) * dilations[d] + 1;
            let span = spatial[d] + pads[d] + pads[n + d] - window;
            if span < 0 {
                return Err(invalid("window larger than the padded input"));
            }
            let o = if ceil {
                (span + strides[d] - 1) / strides[d] + 1
            } else {
                span / strides[d] + 1
            };
            let extra = (o - 1) * strides[d] + window - spatial[d] - pads[d] - pads[n + d];
            if extra > 0 {
                pads[d] += extra / 2;
                pads[n + d] += extra - extra / 2;
            }
            out.push(o);
        }
        let positions: i64 = out.iter().product();
        if positions > 1 << 22 || kernel.iter().product::<i64>() > 1 << 16 {
            return Err(unsupported("too large"));
        }
        Ok(Window {
            kernel,
            strides,
            dilations,
            pads,
            out,
        })
    }

    /// `1 / count` per output position: the window positions inside the
    /// input, or all of them with `count_include_pad` (the reference's
    /// windows never leave the padded input).
    fn inverse_counts(&self, dims: &[i64], include_pad: bool) -> Result<Vec<f32>, Declined> {
        let n = self.kernel.len();
        let spatial = &dims[2..];
        let positions: i64 = self.out.iter().product();
        let mut scale = Vec::with_capacity(positions as usize);
        for p in 0..positions {
            let mut rest = p;
            let mut count = 1i64;
            for d in (0..n).rev() {
                let index = rest % self.out[d];
                rest /= self.out[d];
                let start = index * self.strides[d] - self.pads[d];
                count *= (0..self.kernel[d])
                    .map(|j| start + j * self.dilations[d])
                    .filter(|&i| include_pad || (i >= 0 && i < spatial[d]))
                    .count() as i64;
            }
            scale.push(if count > 0 { 1.0 / count as f32 } else { 0.0 });
        }
        Ok(scale)
    }

    /// The windowed sums of `x`: a depthwise Conv with a ones kernel.
    fn sum(
        &self,
        emit: &mut Emit,
        x: &str,
        channels: i64,
        elem: ElemType,
    ) -> Result<String, Declined> {
        let mut wdims = vec![channels as usize, 1];
        wdims.extend(self.kernel.iter().map(|&k| k as usize));
        let ones = vec![1f32; wdims.iter().product()];
        let w = emit.constant::<f32>(&wdims, &ones)?;
        let w = emit.from_f32(w, elem);
        Ok(emit.op(
            "Conv",
            &[x, &w],
            &[
                Attr::Int("group", channels),
                Attr::Ints("kernel_shape", self.kernel.clone()),
                Attr::Ints("strides", self.strides.clone()),
                Attr::Ints("dilations", self.dilations.clone()),
                Attr::Ints("pads", self.pads.clone()),
            ],
        ))
    }
}

//! Convolution and pooling: spatial dims from kernel, strides, dilations,
//! pads (or auto_pad) and ceil_mode.

use super::{repeated, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::{attr, attr_i, attr_ints};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Conv", Rule::First(window)),
    ("AveragePool", Rule::First(window)),
    // Output and indices: one shape.
    ("MaxPool", Rule::All(|a| repeated(window(a), a.outputs()))),
    ("GlobalAveragePool", GLOBAL),
    ("GlobalMaxPool", GLOBAL),
];

/// N and C kept, every spatial dim 1.
const GLOBAL: Rule = Rule::First(|a| {
    let x = a.input(0)?;
    Some(
        x.iter()
            .enumerate()
            .map(|(i, d)| if i < 2 { d.clone() } else { Dim::Known(1) })
            .collect(),
    )
});

/// A sliding window's attributes, one entry per spatial dim (pads: begins
/// then ends).
struct Window<'a> {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    pads: Vec<i64>,
    auto_pad: &'a [u8],
    ceil: bool,
}

/// [N, C_out, spatial...] of Conv (C_out from the weights) or a pool (C
/// kept).
fn window(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    if x.len() < 3 {
        return None;
    }
    let spatial = x.len() - 2;
    let (channels, kernel) = if a.op == "Conv" {
        let w = a.input(1)?;
        let kernel = attr_ints(a.node, "kernel_shape")
            .map(<[i64]>::to_vec)
            .unwrap_or_else(|| w.iter().skip(2).filter_map(Dim::known).collect());
        (w.first()?.clone(), kernel)
    } else {
        (
            x[1].clone(),
            attr_ints(a.node, "kernel_shape").map(<[i64]>::to_vec)?,
        )
    };
    let ints_or = |name: &str, default: Vec<i64>| {
        attr_ints(a.node, name)
            .map(<[i64]>::to_vec)
            .filter(|v| !v.is_empty())
            .unwrap_or(default)
    };
    let window = Window {
        strides: ints_or("strides", vec![1; spatial]),
        dilations: ints_or("dilations", vec![1; spatial]),
        pads: ints_or("pads", vec![0; 2 * spatial]),
        auto_pad: attr(a.node, "auto_pad")
            .and_then(|p| p.s.as_deref())
            .unwrap_or(b"NOTSET"),
        ceil: attr_i(a.node, "ceil_mode").unwrap_or(0) != 0,
        kernel,
    };
    if window.kernel.len() != spatial
        || window.strides.len() != spatial
        || window.dilations.len() != spatial
        || window.pads.len() != 2 * spatial
    {
        return None;
    }
    let mut out = vec![x[0].clone(), channels];
    for i in 0..spatial {
        out.push(
            x[i + 2]
                .known()
                .map_or(Dim::Unknown, |d| window.output_dim(i, d)),
        );
    }
    Some(out)
}

impl Window<'_> {
    /// Spatial dim `i` of the output for an input dim of `input`.
    fn output_dim(&self, i: usize, input: i64) -> Dim {
        let spatial = self.kernel.len();
        // i128 arithmetic: attributes come from the file and may be absurd.
        let w = |v: i64| v as i128;
        let eff = (w(self.kernel[i]) - 1) * w(self.dilations[i]) + 1;
        let s = w(self.strides[i]).max(1);
        let input = w(input);
        let v = match self.auto_pad {
            b"SAME_UPPER" | b"SAME_LOWER" => (input + s - 1) / s,
            b"VALID" => (input - eff) / s + 1,
            _ => {
                let span = input + w(self.pads[i]) + w(self.pads[i + spatial]) - eff;
                if self.ceil {
                    (span + s - 1) / s + 1
                } else {
                    span / s + 1
                }
            }
        };
        i64::try_from(v).map_or(Dim::Unknown, Dim::Known)
    }
}

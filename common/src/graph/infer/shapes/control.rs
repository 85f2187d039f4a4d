//! Control flow and recurrent ops: If's outputs from its branches, LSTM /
//! GRU / RNN's from X, `hidden_size`, `direction` and `layout`.

use super::{Rule, ShapeArgs};
use crate::graph::build::tensor_type;
use crate::graph::Dim;
use crate::onnx::attr::{attr, attr_i};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("If", Rule::All(if_outputs)),
    ("LSTM", Rule::All(recurrent)),
    ("GRU", Rule::All(recurrent)),
    ("RNN", Rule::All(recurrent)),
];

/// Each output: the branches' declared shape where they agree, unknown
/// dims where they differ, nothing if the ranks differ.
fn if_outputs(a: &ShapeArgs) -> Vec<Option<Vec<Dim>>> {
    (0..a.outputs()).map(|k| if_output(a, k)).collect()
}

fn if_output(a: &ShapeArgs, k: usize) -> Option<Vec<Dim>> {
    let branch = |name: &str| {
        let g = attr(a.node, name)?.g.as_ref()?;
        tensor_type(g.output.get(k)?.r#type.as_ref()?).1
    };
    let (then, otherwise) = (branch("then_branch")?, branch("else_branch")?);
    (then.len() == otherwise.len()).then(|| {
        then.into_iter()
            .zip(otherwise)
            .map(|(x, y)| if x == y { x } else { Dim::Unknown })
            .collect()
    })
}

/// Y, then Y_h (and Y_c).
fn recurrent(a: &ShapeArgs) -> Vec<Option<Vec<Dim>>> {
    let n = a.outputs();
    let Some(x) = a.input(0).filter(|x| x.len() == 3) else {
        return vec![None; n];
    };
    let hidden = attr_i(a.node, "hidden_size").map_or(Dim::Unknown, Dim::Known);
    let dirs = match attr(a.node, "direction").and_then(|p| p.s.as_deref()) {
        Some(b"bidirectional") => Dim::Known(2),
        _ => Dim::Known(1),
    };
    let batch_first = attr_i(a.node, "layout").unwrap_or(0) != 0;
    let (seq, batch) = if batch_first {
        (x[1].clone(), x[0].clone())
    } else {
        (x[0].clone(), x[1].clone())
    };
    let (y, state) = if batch_first {
        (
            vec![batch.clone(), seq, dirs.clone(), hidden.clone()],
            vec![batch, dirs, hidden],
        )
    } else {
        (
            vec![seq, dirs.clone(), batch.clone(), hidden.clone()],
            vec![dirs, batch, hidden],
        )
    };
    (0..n)
        .map(|k| Some(if k == 0 { y.clone() } else { state.clone() }))
        .collect()
}

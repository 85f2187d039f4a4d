//! Recurrent layers (RNN, GRU, LSTM) in their batch-first layout
//! (`layout = 1`: X is [batch, seq, input]) as the sequence-first layout
//! every backend has, with the layout changed by transposes around them.

use super::emit::Emit;
use super::{attr_i, input, output, Context};
use crate::declined::{native, Declined};
use crate::onnx::proto::NodeProto;

/// Transposes that take layout 1 to layout 0: X, initial_h and initial_c
/// swap their first two axes; Y [seq, dirs, batch, hidden] becomes
/// [batch, seq, dirs, hidden], Y_h and Y_c swap their first two axes back.
const SWAP: [i64; 3] = [1, 0, 2];
const Y_TO_BATCH_FIRST: [i64; 4] = [2, 0, 1, 3];

/// The input positions that carry the batch axis first (X, initial_h, and
/// for LSTM initial_c).
fn batched_inputs(op: &str) -> &'static [usize] {
    if op == "LSTM" {
        &[0, 5, 6]
    } else {
        &[0, 5]
    }
}

pub(super) fn batch_first(
    node: &NodeProto,
    _ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    if attr_i(node, "layout") != Some(1) {
        return Err(native("only layout 1 (batch first) is rewritten"));
    }
    let op = node.op_type.as_deref().unwrap_or("");
    let perm = |p: &[i64]| [super::emit::Attr::Ints("perm", p.to_vec())];
    let mut inputs: Vec<String> = node.input.clone();
    for &k in batched_inputs(op) {
        if let Some(x) = input(node, k) {
            inputs[k] = emit.op("Transpose", &[x], &perm(&SWAP));
        }
    }
    // Outputs in layout 0 under fresh names, transposed into the node's.
    let fresh: Vec<Option<&str>> = node.output.iter().map(|_| None).collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let inner = emit.op_into(op, &refs, &[], &fresh);
    emit.copy_attributes_except(node, &["layout"]);
    for (k, name) in inner.iter().enumerate() {
        let Some(y) = output(node, k) else {
            continue;
        };
        let p: &[i64] = if k == 0 { &Y_TO_BATCH_FIRST } else { &SWAP };
        emit.op_into("Transpose", &[name], &perm(p), &[Some(y)]);
    }
    Ok(())
}

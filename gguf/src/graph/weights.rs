//! A decoder's weights as the graph builder takes them: what each family
//! has, the optional parts `None` where a file has none.

use super::embedding::Table;
use crate::quant::{Joined, Native, Weight};

/// q's, k's and v's biases, where the layer has them.
pub type QkvBias = [Option<Vec<f32>>; 3];

/// One layer's weights.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// q, k and v (three tensors, or a fused `attn_qkv` split three ways).
    pub qkv: Joined,
    pub qkv_bias: QkvBias,
    /// RMS norms over each head's q and k, before RoPE (Qwen 3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub o: Weight,
    pub o_bias: Option<Vec<f32>>,
    /// A norm of the attention's output before the residual add (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    /// A norm of the feed-forward's output before the residual add (Gemma).
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A gated feed-forward: `down(act(gate(x)) · up(x))`.
pub struct Dense {
    /// gate and up (two tensors, or Phi-3's one split in halves).
    pub gate_up: Joined,
    pub down: Weight,
}

/// A layer's feed-forward.
pub enum Ffn {
    Dense(Box<Dense>),
    Experts(Box<Experts>),
}

/// A mixture of experts.
pub struct Experts {
    /// `[experts, hidden]`: each token's logit per expert.
    pub router: Weight,
    pub matrices: ExpertMatrices,
    /// Qwen2-MoE's shared expert and its gate's `[hidden]` row (the
    /// expert's output times the sigmoid of that row's product).
    pub shared: Option<(Dense, Vec<f32>)>,
}

/// The experts' matrices.
pub enum ExpertMatrices {
    /// The file's blocks of each 3-D tensor (`experts × rows` rows), each
    /// token's chosen experts multiplied by Tessera's kernels: gate and up
    /// as one matrix (each expert's gate rows, then its up rows) where
    /// they are of one type, else the two.
    Native { gate_up: Vec<Native>, down: Native },
    /// One feed-forward per expert: every expert computed, each output
    /// weighted by its routing weight (0 where it was not chosen), in
    /// operators any onnxruntime runs.
    Each(Vec<Dense>),
}

/// A decoder's weights.
pub struct Weights {
    pub embedding: Table,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The model's own head (`output.weight`); `None`: tied to the
    /// embedding.
    pub output: Option<Weight>,
    /// Per-frequency RoPE divisors: Llama 3's `rope_freqs.weight`, or
    /// LongRoPE's short factors.
    pub rope_freqs: Option<Vec<f32>>,
}

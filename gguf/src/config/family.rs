//! The decoder families read, one row of rules each: what llama.cpp's
//! `src/models/<arch>.cpp` does for the architecture, as data. Tensors
//! that are there or not (q/k norms, biases, post-norms, a fused q/k/v,
//! an untied head) are read from the file; what a file cannot say is here.

/// How RoPE pairs a head's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions 2i and 2i + 1 (llama.cpp's "normal" RoPE: the llama
    /// converter permutes q and k rows for it).
    Interleaved,
    /// Dimensions i and i + d/2 (llama.cpp's NEOX RoPE).
    Halves,
}

/// The feed-forward's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) · up.
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma).
    GeluTanh,
}

/// Which layers attend within a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Every layer, where the file declares a window (Mistral-style).
    Every,
    /// None: the file's window is ignored, as llama.cpp ignores Phi-3's.
    Ignored,
    /// Layer l is local where `l % every < every - 1` (the last of each
    /// `every` attends globally), or as `attention.sliding_window_pattern`
    /// says (a number replacing `every`, or a flag per layer); the window
    /// is the file's, else `default` (no window at all when neither).
    Pattern { every: u32, default: Option<usize> },
}

/// The RoPE of local (windowed) layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalRope {
    /// The global layers' base and scaling (unless `rope.freq_base_swa`).
    Global,
    /// Its own base (`rope.freq_base_swa`, else this) and no scaling.
    Own(f32),
}

/// Mixture-of-experts feed-forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertRule {
    /// Dense feed-forwards only.
    None,
    /// Where `expert_count` > 1: softmax over the router's logits, the top
    /// `expert_used_count`, their weights renormalized to sum to 1 or not;
    /// a shared expert with a sigmoid gate besides (Qwen2-MoE) or not.
    Routed {
        normalized: bool,
        shared: bool,
        /// The key of each expert's feed-forward size (else
        /// `feed_forward_length`).
        ffn_key: Option<&'static str>,
    },
}

/// One family's rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    pub arch: &'static str,
    pub rope: RopeStyle,
    pub activation: Activation,
    /// The embedding's rows are scaled by sqrt(hidden) (Gemma).
    pub scaled_embedding: bool,
    pub windows: Windows,
    pub local_rope: LocalRope,
    /// Soft caps on attention scores and on the logits, `cap ·
    /// tanh(x / cap)`, where the file has no `attn_logit_softcapping` /
    /// `final_logit_softcapping` (`None`: none unless the file sets one;
    /// only families whose graph has a cap read the keys).
    pub attention_cap: Cap,
    pub final_cap: Cap,
    pub query_scale: QueryScale,
    pub experts: ExpertRule,
}

/// Whether a family's graph has a soft cap, and its default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cap {
    /// No cap in this family's graph.
    Never,
    /// The file's, or this default (0: none).
    Default(f32),
}

/// The scale of attention scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryScale {
    /// `attention.scale` where the file sets it, else 1/sqrt(head_dim).
    Key,
    /// 1/sqrt(head_dim).
    HeadDim,
    /// Gemma's: 1/sqrt(hidden / heads) for the 27B model (llama.cpp tells
    /// it by this layer count), else 1/sqrt(head_dim).
    Gemma { layers_of_27b: usize },
}

const fn family(arch: &'static str, rope: RopeStyle) -> Family {
    Family {
        arch,
        rope,
        activation: Activation::Silu,
        scaled_embedding: false,
        windows: Windows::Every,
        local_rope: LocalRope::Global,
        attention_cap: Cap::Never,
        final_cap: Cap::Never,
        query_scale: QueryScale::HeadDim,
        experts: ExpertRule::None,
    }
}

/// Gemma 2 and 3's common rules.
const fn gemma(arch: &'static str, layers_of_27b: usize) -> Family {
    Family {
        activation: Activation::GeluTanh,
        scaled_embedding: true,
        query_scale: QueryScale::Gemma { layers_of_27b },
        ..family(arch, RopeStyle::Halves)
    }
}

/// The families read.
pub const FAMILIES: &[Family] = &[
    Family {
        query_scale: QueryScale::Key,
        // Mixtral is a llama with experts.
        experts: ExpertRule::Routed {
            normalized: true,
            shared: false,
            ffn_key: None,
        },
        ..family("llama", RopeStyle::Interleaved)
    },
    family("qwen2", RopeStyle::Halves),
    family("qwen3", RopeStyle::Halves),
    Family {
        experts: ExpertRule::Routed {
            normalized: false,
            shared: true,
            ffn_key: Some("expert_feed_forward_length"),
        },
        ..family("qwen2moe", RopeStyle::Halves)
    },
    Family {
        windows: Windows::Ignored,
        ..family("phi3", RopeStyle::Halves)
    },
    Family {
        windows: Windows::Pattern {
            every: 2,
            default: Some(4096),
        },
        attention_cap: Cap::Default(50.0),
        final_cap: Cap::Default(30.0),
        ..gemma("gemma2", 46)
    },
    Family {
        windows: Windows::Pattern {
            every: 6,
            default: None,
        },
        local_rope: LocalRope::Own(10_000.0),
        final_cap: Cap::Default(0.0),
        ..gemma("gemma3", 62)
    },
];

/// The family of an architecture.
pub fn of(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.arch == arch)
}

/// The architectures read, for messages.
pub fn names() -> String {
    FAMILIES
        .iter()
        .map(|f| f.arch)
        .collect::<Vec<_>>()
        .join(", ")
}

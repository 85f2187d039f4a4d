//! A decoder's hyperparameters from GGUF metadata (`{arch}.block_count`,
//! `{arch}.attention.head_count`, …), with llama.cpp's defaults where a key
//! is optional and its family's rules ([`family`]) where the file cannot
//! say; [`Meta`] is the typed access the rest of the crate reads metadata
//! with.

pub mod family;
mod meta;

pub use family::{Activation, Family, RopeStyle};
pub use meta::Meta;

use family::{Cap, ExpertRule, LocalRope, QueryScale, Windows};

use crate::file::Value;
use crate::GgufError;

/// How RoPE's angles are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor (`rope.scaling.type = linear`).
    Linear(f32),
}

/// One set of RoPE angles: `p · scale · base^(−2i/dims)`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    pub base: f32,
    pub scaling: RopeScaling,
}

/// A decoder's RoPE.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// The leading dimensions of each head it turns (the rest stay).
    pub dims: usize,
    /// The global layers' angles.
    pub global: RopeTable,
    /// The local (windowed) layers', where they differ.
    pub local: Option<RopeTable>,
    /// cos and sin are multiplied by this (LongRoPE's attention factor,
    /// `rope.scaling.attn_factor`).
    pub attn_factor: f32,
    /// The context the model was trained for before its RoPE was scaled
    /// (`rope.scaling.original_context_length`).
    pub original_context: usize,
}

/// A mixture of experts in every layer's feed-forward.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    pub count: usize,
    /// Experts each token is sent to.
    pub used: usize,
    /// Each expert's feed-forward size.
    pub ffn: usize,
    /// The chosen experts' weights renormalized to sum to 1.
    pub normalized: bool,
    /// The weights' scale (`expert_weights_scale`), where not 1.
    pub scale: Option<f32>,
    /// A shared expert's feed-forward size (Qwen2-MoE), gated by a sigmoid.
    pub shared_ffn: Option<usize>,
}

/// A decoder's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub arch: String,
    pub family: Family,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rms_eps: f32,
    pub rope: Rope,
    /// The positions the model was trained for.
    pub context_length: usize,
    /// Each layer's sliding window (attention to the last this many
    /// positions, the position itself included), `None`: global.
    pub windows: Vec<Option<usize>>,
    /// The attention's score scale where not 1/sqrt(head_dim).
    pub attention_scale: Option<f32>,
    /// Soft caps on the attention scores and on the logits.
    pub attention_cap: Option<f32>,
    pub final_cap: Option<f32>,
    pub experts: Option<Experts>,
}

impl DecoderConfig {
    pub fn from_meta(meta: &Meta<'_, '_>) -> Result<DecoderConfig, GgufError> {
        let arch = meta.str("general.architecture")?;
        let family = *family::of(arch).ok_or_else(|| GgufError::Architecture(arch.to_string()))?;
        let key = |k: &str| format!("{arch}.{k}");
        let layers = meta.count(&key("block_count"))?;
        let hidden = meta.count(&key("embedding_length"))?;
        let heads_key = key("attention.head_count");
        let heads = meta
            .per_layer(&heads_key, layers)?
            .ok_or(GgufError::MissingKey(heads_key))? as usize;
        let kv_heads = meta
            .per_layer(&key("attention.head_count_kv"), layers)?
            .map_or(heads, |v| v as usize);
        let ffn_key = key("feed_forward_length");
        let ffn = meta.per_layer(&ffn_key, layers)?.unwrap_or(0) as usize;
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(GgufError::Metadata {
                key: key("attention.head_count_kv"),
                reason: format!("{kv_heads} key/value heads for {heads} query heads"),
            });
        }
        let head_dim = meta
            .opt_u64(&key("attention.key_length"))?
            .map_or(hidden / heads, |v| v as usize);
        let value_dim = meta
            .opt_u64(&key("attention.value_length"))?
            .map_or(head_dim, |v| v as usize);
        if value_dim != head_dim {
            return Err(GgufError::Unsupported(format!(
                "keys of {head_dim} and values of {value_dim} per head"
            )));
        }
        let eps = meta
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| GgufError::MissingKey(key("attention.layer_norm_rms_epsilon")))?;
        let context_length = meta.count(&key("context_length"))?;
        let experts = experts(meta, &family, layers, ffn)?;
        if ffn == 0 && experts.is_none() {
            return Err(GgufError::MissingKey(ffn_key));
        }
        let shape = Shape {
            layers,
            hidden,
            heads,
            head_dim,
        };
        Ok(DecoderConfig {
            arch: arch.to_string(),
            family,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            rms_eps: eps as f32,
            rope: rope(meta, &family, head_dim, context_length)?,
            context_length,
            windows: windows(meta, &family, layers)?,
            attention_scale: attention_scale(meta, &family, shape)?,
            attention_cap: cap(meta, family.attention_cap, &key("attn_logit_softcapping"))?,
            final_cap: cap(meta, family.final_cap, &key("final_logit_softcapping"))?,
            experts,
        })
    }

    /// Query heads that share one key/value head.
    pub fn groups(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Layer `l`'s RoPE angles.
    pub fn rope_of(&self, l: usize) -> &RopeTable {
        match (&self.rope.local, self.windows.get(l)) {
            (Some(local), Some(Some(_))) => local,
            _ => &self.rope.global,
        }
    }
}

/// What the attention scale depends on.
#[derive(Clone, Copy)]
struct Shape {
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
}

fn attention_scale(
    meta: &Meta<'_, '_>,
    family: &Family,
    s: Shape,
) -> Result<Option<f32>, GgufError> {
    Ok(match family.query_scale {
        QueryScale::HeadDim => None,
        QueryScale::Key => meta
            .opt_f32(&format!("{}.attention.scale", family.arch))?
            .filter(|&s| s != 0.0),
        QueryScale::Gemma { layers_of_27b } if s.layers == layers_of_27b => {
            Some(1.0 / ((s.hidden / s.heads) as f32).sqrt())
        }
        QueryScale::Gemma { .. } => Some(1.0 / (s.head_dim as f32).sqrt()),
    })
}

fn cap(meta: &Meta<'_, '_>, rule: Cap, key: &str) -> Result<Option<f32>, GgufError> {
    Ok(match rule {
        Cap::Never => None,
        Cap::Default(d) => Some(meta.opt_f32(key)?.unwrap_or(d)).filter(|&c| c > 0.0),
    })
}

/// Each layer's window, by the family's rule and the file's keys.
fn windows(
    meta: &Meta<'_, '_>,
    family: &Family,
    layers: usize,
) -> Result<Vec<Option<usize>>, GgufError> {
    let arch = family.arch;
    let declared = meta
        .opt_u64(&format!("{arch}.attention.sliding_window"))?
        .filter(|&w| w > 0)
        .map(|w| w as usize);
    Ok(match family.windows {
        Windows::Ignored => vec![None; layers],
        Windows::Every => vec![declared; layers],
        Windows::Pattern { every, default } => {
            let Some(window) = declared.or(default) else {
                return Ok(vec![None; layers]);
            };
            let key = format!("{arch}.attention.sliding_window_pattern");
            let local: Vec<bool> = match meta.value(&key) {
                Some(Value::Array(_)) => meta.layer_flags(&key, layers)?.unwrap_or_default(),
                _ => {
                    let n = meta.opt_u64(&key)?.map_or(every, |n| n as u32) as usize;
                    (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
                }
            };
            local.into_iter().map(|w| w.then_some(window)).collect()
        }
    })
}

/// The decoder's RoPE: style and dimensions, the global and local angles.
fn rope(
    meta: &Meta<'_, '_>,
    family: &Family,
    head_dim: usize,
    context: usize,
) -> Result<Rope, GgufError> {
    let arch = family.arch;
    let key = |k: &str| format!("{arch}.{k}");
    let dims = meta
        .opt_u64(&key("rope.dimension_count"))?
        .map_or(head_dim, |v| v as usize);
    let partial_ok = family.rope == RopeStyle::Halves;
    if dims == 0 || dims > head_dim || dims % 2 == 1 || (dims != head_dim && !partial_ok) {
        return Err(GgufError::Unsupported(format!(
            "RoPE over {dims} of {head_dim} dimensions per head"
        )));
    }
    let base = meta.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let global = RopeTable {
        base,
        scaling: rope_scaling(meta, arch)?,
    };
    let local_base = meta.opt_f32(&key("rope.freq_base_swa"))?;
    let local = match family.local_rope {
        LocalRope::Global => RopeTable {
            base: local_base.unwrap_or(base),
            ..global.clone()
        },
        LocalRope::Own(default) => RopeTable {
            base: local_base.unwrap_or(default),
            scaling: RopeScaling::None,
        },
    };
    Ok(Rope {
        style: family.rope,
        dims,
        local: (local != global).then_some(local),
        global,
        attn_factor: meta
            .opt_f32(&key("rope.scaling.attn_factor"))?
            .filter(|&f| f > 0.0)
            .unwrap_or(1.0),
        original_context: meta
            .opt_u64(&key("rope.scaling.original_context_length"))?
            .filter(|&n| n > 0)
            .map_or(context, |n| n as usize),
    })
}

/// The mixture of experts, where the file has one (`expert_count` > 1, as
/// llama.cpp reads it).
fn experts(
    meta: &Meta<'_, '_>,
    family: &Family,
    layers: usize,
    ffn: usize,
) -> Result<Option<Experts>, GgufError> {
    let key = |k: &str| format!("{}.{k}", family.arch);
    let count = meta.opt_u64(&key("expert_count"))?.unwrap_or(0) as usize;
    let ExpertRule::Routed {
        normalized,
        shared,
        ffn_key,
    } = family.experts
    else {
        if count > 1 {
            return Err(GgufError::Unsupported(format!(
                "a mixture of experts ({} = {count}) in a {} model",
                key("expert_count"),
                family.arch
            )));
        }
        return Ok(None);
    };
    if count <= 1 {
        if shared {
            return Err(GgufError::MissingKey(key("expert_count")));
        }
        return Ok(None);
    }
    let used = meta
        .per_layer(&key("expert_used_count"), layers)?
        .ok_or_else(|| GgufError::MissingKey(key("expert_used_count")))? as usize;
    if used == 0 || used > count {
        return Err(GgufError::Metadata {
            key: key("expert_used_count"),
            reason: format!("{used} of {count} experts"),
        });
    }
    let expert_ffn = match ffn_key {
        Some(k) => meta.per_layer(&key(k), layers)?.map(|v| v as usize),
        None => None,
    }
    .filter(|&n| n > 0)
    .unwrap_or(if ffn_key.is_some() { ffn / used } else { ffn });
    if expert_ffn == 0 {
        return Err(GgufError::MissingKey(key("feed_forward_length")));
    }
    let shared_ffn = if shared {
        let n = meta
            .opt_u64(&key("expert_shared_feed_forward_length"))?
            .filter(|&n| n > 0)
            .map_or(ffn, |n| n as usize);
        if n == 0 {
            return Err(GgufError::MissingKey(key(
                "expert_shared_feed_forward_length",
            )));
        }
        Some(n)
    } else {
        None
    };
    Ok(Some(Experts {
        count,
        used,
        ffn: expert_ffn,
        normalized,
        scale: meta
            .opt_f32(&key("expert_weights_scale"))?
            .filter(|&s| s != 0.0 && s != 1.0),
        shared_ffn,
    }))
}

/// `{arch}.rope.scaling.type` (llama.cpp's default is linear) and its
/// factor (`rope.scaling.factor`, or the older `rope.scale_linear`);
/// LongRoPE's factors are tensors (`rope_factors_short`/`_long`).
fn rope_scaling(meta: &Meta<'_, '_>, arch: &str) -> Result<RopeScaling, GgufError> {
    let kind = meta
        .opt_str(&format!("{arch}.rope.scaling.type"))?
        .unwrap_or("linear");
    let factor = match meta.opt_f64(&format!("{arch}.rope.scaling.factor"))? {
        Some(f) => Some(f),
        None => meta.opt_f64(&format!("{arch}.rope.scale_linear"))?,
    }
    .filter(|&f| f != 0.0 && f != 1.0);
    match (kind, factor) {
        ("none", _) | ("linear", None) | ("longrope", _) => Ok(RopeScaling::None),
        ("linear", Some(f)) if f > 0.0 => Ok(RopeScaling::Linear(f as f32)),
        (other, _) => Err(GgufError::Unsupported(format!(
            "RoPE scaling '{other}' (factor {factor:?}); none, linear, Llama 3's rope_freqs and LongRoPE's factors are read"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::GgufFile;
    use crate::testing::Writer;

    fn of(arch: &str, extra: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new();
        let k = |s: &str| format!("{arch}.{s}");
        w.kv_str("general.architecture", arch);
        w.kv_u32(&k("block_count"), 12);
        w.kv_u32(&k("embedding_length"), 64);
        w.kv_u32(&k("feed_forward_length"), 128);
        w.kv_u32(&k("attention.head_count"), 4);
        w.kv_u32(&k("attention.head_count_kv"), 2);
        w.kv_f32(&k("attention.layer_norm_rms_epsilon"), 1e-5);
        w.kv_u32(&k("context_length"), 256);
        extra(&mut w);
        w.finish()
    }

    fn llama(extra: impl FnOnce(&mut Writer)) -> Vec<u8> {
        of("llama", extra)
    }

    fn config(bytes: &[u8]) -> Result<DecoderConfig, GgufError> {
        let file = GgufFile::parse(bytes)?;
        DecoderConfig::from_meta(&Meta { file: &file })
    }

    #[test]
    fn defaults_follow_llama_cpp() {
        let c = config(&llama(|_| {})).unwrap();
        assert_eq!(
            (c.head_dim, c.groups(), c.rope.global.base),
            (16, 2, 10_000.0)
        );
        assert_eq!(c.rope.global.scaling, RopeScaling::None);
        assert_eq!((c.rope.style, c.rope.dims), (RopeStyle::Interleaved, 16));
        let c = config(&llama(|w| {
            w.kv_str("llama.rope.scaling.type", "linear");
            w.kv_f32("llama.rope.scaling.factor", 4.0);
            w.kv_u32("llama.attention.sliding_window", 4096);
        }))
        .unwrap();
        assert_eq!(c.rope.global.scaling, RopeScaling::Linear(4.0));
        assert_eq!(c.windows, vec![Some(4096); 12]);
    }

    #[test]
    fn gemma_s_windows_caps_and_local_rope_follow_llama_cpp() {
        let c = config(&of("gemma2", |_| {})).unwrap();
        // Every other layer local, 4096 by default; caps 50 and 30.
        assert_eq!(c.windows[..3], [Some(4096), None, Some(4096)]);
        assert_eq!((c.attention_cap, c.final_cap), (Some(50.0), Some(30.0)));
        assert_eq!(c.attention_scale, Some(0.25));
        assert_eq!(c.rope.local, None);
        assert_eq!(c.family.activation, Activation::GeluTanh);
        let c = config(&of("gemma3", |w| {
            w.kv_u32("gemma3.attention.sliding_window", 512);
            w.kv_f32("gemma3.rope.freq_base", 1e6);
            w.kv_str("gemma3.rope.scaling.type", "linear");
            w.kv_f32("gemma3.rope.scaling.factor", 8.0);
        }))
        .unwrap();
        // Five local layers, then a global one.
        let local: Vec<bool> = c.windows.iter().map(Option::is_some).collect();
        assert_eq!(local[..7], [true, true, true, true, true, false, true]);
        assert_eq!((c.attention_cap, c.final_cap), (None, None));
        assert_eq!(c.rope_of(0).base, 10_000.0);
        assert_eq!(c.rope_of(0).scaling, RopeScaling::None);
        assert_eq!(c.rope_of(5).scaling, RopeScaling::Linear(8.0));
        // Without a window, gemma3 attends globally everywhere.
        let c = config(&of("gemma3", |_| {})).unwrap();
        assert_eq!(c.windows, vec![None; 12]);
        // Phi-3's window is ignored, as llama.cpp ignores it.
        let c = config(&of("phi3", |w| {
            w.kv_u32("phi3.attention.sliding_window", 2047)
        }))
        .unwrap();
        assert_eq!(c.windows, vec![None; 12]);
    }

    #[test]
    fn experts_are_read_by_the_family_s_rule() {
        let c = config(&llama(|w| {
            w.kv_u32("llama.expert_count", 8);
            w.kv_u32("llama.expert_used_count", 2);
        }))
        .unwrap();
        let e = c.experts.unwrap();
        assert_eq!((e.count, e.used, e.ffn, e.normalized), (8, 2, 128, true));
        assert_eq!(e.shared_ffn, None);
        let c = config(&of("qwen2moe", |w| {
            w.kv_u32("qwen2moe.expert_count", 4);
            w.kv_u32("qwen2moe.expert_used_count", 2);
            w.kv_u32("qwen2moe.expert_feed_forward_length", 32);
            w.kv_u32("qwen2moe.expert_shared_feed_forward_length", 96);
        }))
        .unwrap();
        let e = c.experts.unwrap();
        assert_eq!((e.ffn, e.normalized, e.shared_ffn), (32, false, Some(96)));
        let e = config(&of("qwen3", |w| w.kv_u32("qwen3.expert_count", 4)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a mixture of experts"), "{e}");
        let e = config(&llama(|w| {
            w.kv_u32("llama.expert_count", 4);
            w.kv_u32("llama.expert_used_count", 5);
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("5 of 4 experts"), "{e}");
    }

    #[test]
    fn what_is_not_read_is_named() {
        let e = config(&llama(|w| w.kv_str("llama.rope.scaling.type", "yarn")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("yarn"), "{e}");
        let mut w = Writer::new();
        w.kv_str("general.architecture", "rwkv7");
        let e = config(&w.finish()).unwrap_err().to_string();
        assert!(e.contains("'rwkv7' is not supported"), "{e}");
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama");
        let e = config(&w.finish()).unwrap_err().to_string();
        assert_eq!(e, "GGUF metadata has no llama.block_count");
        let e = config(&llama(|w| w.kv_str("llama.expert_count", "8")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expert_count"), "{e}");
    }
}

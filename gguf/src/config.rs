//! A decoder's hyperparameters from GGUF metadata (`{arch}.block_count`,
//! `{arch}.attention.head_count`, …), with llama.cpp's defaults where a key
//! is optional, and the typed accessors the rest of the crate reads
//! metadata with.

use crate::file::{Array, GgufFile, Value};
use crate::GgufError;

/// Typed access to a file's metadata; a missing or mistyped required key
/// is an error naming it.
pub struct Meta<'f, 'a> {
    pub file: &'f GgufFile<'a>,
}

impl<'a> Meta<'_, 'a> {
    pub fn value(&self, key: &str) -> Option<&Value<'a>> {
        self.file.get(key)
    }

    fn wrong(key: &str, want: &str, got: &Value<'_>) -> GgufError {
        GgufError::Metadata {
            key: key.to_string(),
            reason: format!("a {}, not {want}", got.kind()),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, GgufError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(key, "a string", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&'a str, GgufError> {
        self.opt_str(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Int(i)) => u64::try_from(*i)
                .map(Some)
                .map_err(|_| GgufError::Metadata {
                    key: key.to_string(),
                    reason: format!("{i} is negative or too large"),
                }),
            Some(v) => Err(Self::wrong(key, "an integer", v)),
        }
    }

    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        self.opt_u64(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// A count that must be at least 1 and fit a `usize`.
    pub fn count(&self, key: &str) -> Result<usize, GgufError> {
        let n = self.u64(key)?;
        if n == 0 || n > u32::MAX as u64 {
            return Err(GgufError::Metadata {
                key: key.to_string(),
                reason: format!("{n} is out of range"),
            });
        }
        Ok(n as usize)
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Float(f)) => Ok(Some(*f)),
            Some(Value::Int(i)) => Ok(Some(*i as f64)),
            Some(v) => Err(Self::wrong(key, "a number", v)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Int(i)) => Ok(Some(*i != 0)),
            Some(v) => Err(Self::wrong(key, "a bool", v)),
        }
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<Array<'a>>, GgufError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(*a)),
            Some(v) => Err(Self::wrong(key, "an array", v)),
        }
    }

    /// A key that is one number for every layer, or an array of one per
    /// layer that must all be equal (Tessera's graph takes one).
    pub fn per_layer(&self, key: &str, layers: usize) -> Result<Option<u64>, GgufError> {
        match self.value(key) {
            Some(Value::Array(a)) => {
                let values = a.integers(key)?;
                let first = values.first().copied();
                if values.len() != layers || values.iter().any(|&v| Some(v) != first) {
                    return Err(GgufError::Unsupported(format!(
                        "{key} differs between layers ({values:?}); one value for every layer is read"
                    )));
                }
                Ok(first.and_then(|v| u64::try_from(v).ok()))
            }
            _ => self.opt_u64(key),
        }
    }
}

/// How RoPE's angles are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor (`rope.scaling.type = linear`).
    Linear(f32),
}

/// A llama-family decoder's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub arch: String,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_scaling: RopeScaling,
    /// The positions the model was trained for.
    pub context_length: usize,
    /// Attention to the last this many positions only (Mistral's sliding
    /// window), where the file declares one.
    pub sliding_window: Option<usize>,
    /// The attention's score scale where the file sets one (else
    /// 1/sqrt(head_dim)).
    pub attention_scale: Option<f32>,
}

/// The architectures read.
const ARCHITECTURES: &[&str] = &["llama"];

impl DecoderConfig {
    pub fn from_meta(meta: &Meta<'_, '_>) -> Result<DecoderConfig, GgufError> {
        let arch = meta.str("general.architecture")?;
        if !ARCHITECTURES.contains(&arch) {
            return Err(GgufError::Architecture(arch.to_string()));
        }
        let key = |k: &str| format!("{arch}.{k}");
        if meta.opt_u64(&key("expert_count"))?.unwrap_or(0) > 0 {
            return Err(GgufError::Unsupported(format!(
                "a mixture of experts ({} = {}); dense {arch} models are read",
                key("expert_count"),
                meta.u64(&key("expert_count"))?
            )));
        }
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
        let ffn = meta
            .per_layer(&ffn_key, layers)?
            .ok_or(GgufError::MissingKey(ffn_key))? as usize;
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
        let rope_dims = meta
            .opt_u64(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if rope_dims != head_dim {
            return Err(GgufError::Unsupported(format!(
                "RoPE over {rope_dims} of {head_dim} dimensions per head"
            )));
        }
        let eps = meta
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| GgufError::MissingKey(key("attention.layer_norm_rms_epsilon")))?;
        Ok(DecoderConfig {
            arch: arch.to_string(),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            rms_eps: eps as f32,
            rope_base: meta.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0) as f32,
            rope_scaling: rope_scaling(meta, arch)?,
            context_length: meta.count(&key("context_length"))?,
            sliding_window: meta
                .opt_u64(&key("attention.sliding_window"))?
                .filter(|&w| w > 0)
                .map(|w| w as usize),
            attention_scale: meta
                .opt_f64(&key("attention.scale"))?
                .filter(|&s| s != 0.0)
                .map(|s| s as f32),
        })
    }

    /// Query heads that share one key/value head.
    pub fn groups(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// `{arch}.rope.scaling.type` (llama.cpp's default is linear) and its
/// factor (`rope.scaling.factor`, or the older `rope.scale_linear`).
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
        ("none", _) | ("linear", None) => Ok(RopeScaling::None),
        ("linear", Some(f)) if f > 0.0 => Ok(RopeScaling::Linear(f as f32)),
        (other, _) => Err(GgufError::Unsupported(format!(
            "RoPE scaling '{other}' (factor {factor:?}); none, linear and Llama 3's rope_freqs are read"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Writer;

    fn llama(extra: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.block_count", 2);
        w.kv_u32("llama.embedding_length", 64);
        w.kv_u32("llama.feed_forward_length", 128);
        w.kv_u32("llama.attention.head_count", 4);
        w.kv_u32("llama.attention.head_count_kv", 2);
        w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
        w.kv_u32("llama.context_length", 256);
        extra(&mut w);
        w.finish()
    }

    fn config(bytes: &[u8]) -> Result<DecoderConfig, GgufError> {
        let file = GgufFile::parse(bytes)?;
        DecoderConfig::from_meta(&Meta { file: &file })
    }

    #[test]
    fn defaults_follow_llama_cpp() {
        let c = config(&llama(|_| {})).unwrap();
        assert_eq!((c.head_dim, c.groups(), c.rope_base), (16, 2, 10_000.0));
        assert_eq!(c.rope_scaling, RopeScaling::None);
        let c = config(&llama(|w| {
            w.kv_str("llama.rope.scaling.type", "linear");
            w.kv_f32("llama.rope.scaling.factor", 4.0);
            w.kv_u32("llama.attention.sliding_window", 4096);
        }))
        .unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear(4.0));
        assert_eq!(c.sliding_window, Some(4096));
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

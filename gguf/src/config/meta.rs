//! Typed access to a GGUF's metadata: a missing or mistyped required key
//! is an error naming it.

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

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        Ok(self.opt_f64(key)?.map(|v| v as f32))
    }

    /// A per-layer flag: an array of one bool (or 0/1) per layer.
    pub fn layer_flags(&self, key: &str, layers: usize) -> Result<Option<Vec<bool>>, GgufError> {
        let Some(a) = self.opt_array(key)? else {
            return Ok(None);
        };
        let values = a.numbers(key)?;
        if values.len() != layers {
            return Err(GgufError::Metadata {
                key: key.to_string(),
                reason: format!("{} values for {layers} layers", values.len()),
            });
        }
        Ok(Some(values.into_iter().map(|v| v != 0.0).collect()))
    }
}

//! The GGUF container (versions 2 and 3, little-endian): a header, typed
//! metadata, tensor descriptions and the tensors' bytes at an aligned
//! offset. Parsed over a byte slice (a memory map): strings and tensor
//! bytes are borrowed, arrays decoded only when read, and every length and
//! offset checked against the slice, so a truncated or garbled file is an
//! error naming what is wrong, never a panic or an allocation the file
//! does not back.

use std::collections::BTreeMap;

use crate::types::GgmlType;
use crate::GgufError;

const MAGIC: &[u8; 4] = b"GGUF";
/// Tensor data starts at a multiple of this unless `general.alignment` says.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a tensor may have (ggml's GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;

/// A metadata value's type, as the file numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_u32(v: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type.
    fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        Some(match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String | Array => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }
}

/// A metadata value. Arrays keep their encoded bytes and are decoded as
/// they are read ([`Array`]).
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(&'a str),
    Array(Array<'a>),
}

impl<'a> Value<'a> {
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// An array value: `len` elements of `elem`, encoded in `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Array<'a> {
    pub elem: ValueType,
    pub len: usize,
    bytes: &'a [u8],
}

impl<'a> Array<'a> {
    /// The elements as strings (an array of another type is an error).
    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>, GgufError> {
        if self.elem != ValueType::String {
            return Err(self.wrong_type(key, "strings"));
        }
        let mut r = Reader::new(self.bytes, 0);
        (0..self.len).map(|_| r.string(key)).collect()
    }

    /// The elements as numbers (integers and floats).
    pub fn numbers(&self, key: &str) -> Result<Vec<f64>, GgufError> {
        let mut r = Reader::new(self.bytes, 0);
        (0..self.len)
            .map(|_| match r.scalar(self.elem, key)? {
                Value::Int(i) => Ok(i as f64),
                Value::Float(f) => Ok(f),
                Value::Bool(b) => Ok(f64::from(u8::from(b))),
                _ => Err(self.wrong_type(key, "numbers")),
            })
            .collect()
    }

    /// The elements as integers.
    pub fn integers(&self, key: &str) -> Result<Vec<i128>, GgufError> {
        let mut r = Reader::new(self.bytes, 0);
        (0..self.len)
            .map(|_| match r.scalar(self.elem, key)? {
                Value::Int(i) => Ok(i),
                _ => Err(self.wrong_type(key, "integers")),
            })
            .collect()
    }

    fn wrong_type(&self, key: &str, want: &str) -> GgufError {
        GgufError::Metadata {
            key: key.to_string(),
            reason: format!("an array of {}, not of {want}", self.elem.name()),
        }
    }
}

/// A tensor's description: name, shape (ggml order: `dims[0]` is the
/// fastest-moving axis, the row length), type and where its bytes lie.
#[derive(Debug, Clone)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of its bytes from the start of the file.
    pub offset: u64,
    /// Its bytes' length.
    pub len: u64,
}

impl TensorInfo<'_> {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Its shape as (rows, row length): a matrix's `[out, in]`.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, cols)
    }
}

/// A parsed GGUF file over its bytes.
#[derive(Debug)]
pub struct GgufFile<'a> {
    pub version: u32,
    bytes: &'a [u8],
    metadata: BTreeMap<&'a str, Value<'a>>,
    tensors: Vec<TensorInfo<'a>>,
    /// Where the tensor data begins.
    pub data_offset: u64,
}

impl<'a> GgufFile<'a> {
    /// Parses the header, metadata and tensor descriptions of `bytes`, and
    /// checks that every tensor's bytes lie within it.
    pub fn parse(bytes: &'a [u8]) -> Result<GgufFile<'a>, GgufError> {
        if bytes.len() < 4 || &bytes[..4] != MAGIC {
            return Err(GgufError::NotGguf);
        }
        let mut r = Reader::new(bytes, 4);
        let version = r.u32("the version")?;
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(GgufError::Unsupported(
                "a big-endian GGUF (only little-endian files are read)".into(),
            ));
        }
        if !(2..=3).contains(&version) {
            return Err(GgufError::Unsupported(format!(
                "GGUF version {version} (versions 2 and 3 are read)"
            )));
        }
        let tensor_count = r.count("the tensor count", 8)?;
        let kv_count = r.count("the metadata count", 12)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string("a metadata key")?;
            let ty = r.u32(key)?;
            let ty = ValueType::from_u32(ty).ok_or_else(|| GgufError::Metadata {
                key: key.to_string(),
                reason: format!("unknown value type {ty}"),
            })?;
            let value = r.value(ty, key)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            tensors.push(r.tensor_info()?);
        }
        let alignment = match metadata.get("general.alignment") {
            Some(Value::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
            Some(v) => {
                return Err(GgufError::Metadata {
                    key: "general.alignment".into(),
                    reason: format!("{v:?} is not a power of two"),
                })
            }
            None => DEFAULT_ALIGNMENT,
        };
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let mut file = GgufFile {
            version,
            bytes,
            metadata,
            tensors,
            data_offset,
        };
        file.place_tensors(alignment)?;
        Ok(file)
    }

    /// Turns each tensor's relative offset into an absolute one and checks
    /// its alignment and that its bytes lie within the file.
    fn place_tensors(&mut self, alignment: u64) -> Result<(), GgufError> {
        let file_len = self.bytes.len() as u64;
        for t in &mut self.tensors {
            if !t.offset.is_multiple_of(alignment) {
                return Err(GgufError::Tensor {
                    name: t.name.to_string(),
                    reason: format!("its offset {} is not aligned to {alignment}", t.offset),
                });
            }
            let start = self.data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.len));
            match end {
                Some(end) if end <= file_len => t.offset += self.data_offset,
                _ => {
                    return Err(GgufError::Truncated(format!(
                        "tensor {}'s {} bytes end past the file's {file_len}",
                        t.name, t.len
                    )))
                }
            }
        }
        Ok(())
    }

    pub fn metadata(&self) -> &BTreeMap<&'a str, Value<'a>> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.metadata.get(key)
    }

    pub fn tensors(&self) -> &[TensorInfo<'a>] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo<'a>> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's bytes (checked to lie within the file at parse time).
    pub fn data(&self, t: &TensorInfo<'_>) -> &'a [u8] {
        &self.bytes[t.offset as usize..(t.offset + t.len) as usize]
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A cursor over the file's bytes; every read checks its length.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], pos: usize) -> Reader<'a> {
        Reader { bytes, pos }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated(format!(
                "{what} at byte {} needs {n} bytes, the file has {}",
                self.pos,
                self.bytes.len()
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_bytes` each: more than the rest
    /// of the file could hold is garbage, refused before anything is
    /// allocated for it.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let room = (self.bytes.len() - self.pos) / min_bytes.max(1);
        if n > room as u64 {
            return Err(GgufError::Truncated(format!(
                "{what} is {n}, more than the file's remaining {} bytes can hold",
                self.bytes.len() - self.pos
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<&'a str, GgufError> {
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .map_err(|_| GgufError::Truncated(format!("{what}: a string of {len} bytes")))?;
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw).map_err(|e| GgufError::Metadata {
            key: what.to_string(),
            reason: format!("a string that is not UTF-8 ({e})"),
        })
    }

    fn scalar(&mut self, ty: ValueType, key: &str) -> Result<Value<'a>, GgufError> {
        use ValueType::*;
        Ok(match ty {
            U8 => Value::Int(self.array::<1>(key)?[0].into()),
            I8 => Value::Int((self.array::<1>(key)?[0] as i8).into()),
            U16 => Value::Int(u16::from_le_bytes(self.array(key)?).into()),
            I16 => Value::Int(i16::from_le_bytes(self.array(key)?).into()),
            U32 => Value::Int(u32::from_le_bytes(self.array(key)?).into()),
            I32 => Value::Int(i32::from_le_bytes(self.array(key)?).into()),
            U64 => Value::Int(u64::from_le_bytes(self.array(key)?).into()),
            I64 => Value::Int(i64::from_le_bytes(self.array(key)?).into()),
            F32 => Value::Float(f32::from_le_bytes(self.array(key)?).into()),
            F64 => Value::Float(f64::from_le_bytes(self.array(key)?)),
            Bool => Value::Bool(self.array::<1>(key)?[0] != 0),
            String => Value::Str(self.string(key)?),
            Array => {
                return Err(GgufError::Metadata {
                    key: key.to_string(),
                    reason: "an array of arrays".into(),
                })
            }
        })
    }

    fn value(&mut self, ty: ValueType, key: &str) -> Result<Value<'a>, GgufError> {
        if ty != ValueType::Array {
            return self.scalar(ty, key);
        }
        let elem = self.u32(key)?;
        let elem = ValueType::from_u32(elem).ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: format!("an array of unknown type {elem}"),
        })?;
        let len = self.count(key, elem.fixed_size().unwrap_or(8))?;
        let start = self.pos;
        match elem.fixed_size() {
            Some(size) => {
                self.take(len * size, key)?;
            }
            None if elem == ValueType::String => {
                for _ in 0..len {
                    let n = self.u64(key)? as usize;
                    self.take(n, key)?;
                }
            }
            None => {
                return Err(GgufError::Metadata {
                    key: key.to_string(),
                    reason: "an array of arrays".into(),
                })
            }
        }
        Ok(Value::Array(Array {
            elem,
            len,
            bytes: &self.bytes[start..self.pos],
        }))
    }

    fn tensor_info(&mut self) -> Result<TensorInfo<'a>, GgufError> {
        let name = self.string("a tensor name")?;
        let bad = |reason: String| GgufError::Tensor {
            name: name.to_string(),
            reason,
        };
        let n_dims = self.u32(name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("{n_dims} dimensions (1 to {MAX_DIMS})")));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64(name))
            .collect::<Result<Vec<u64>, _>>()?;
        let ty = GgmlType::from_id(self.u32(name)?);
        let offset = self.u64(name)?;
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        let len = ty.data_len(&dims).map_err(bad)?;
        debug_assert!(len > 0 || elements == 0);
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Writer;

    #[test]
    fn reads_what_the_writer_wrote() {
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.block_count", 2);
        w.kv_strs("tokenizer.ggml.tokens", &["a", "b", "ab"]);
        w.kv_f32s("tokenizer.ggml.scores", &[0.0, -1.0, -2.0]);
        w.tensor_f32("x.weight", &[4, 2], &[1.0; 8]);
        let bytes = w.finish();
        let f = GgufFile::parse(&bytes).unwrap();
        assert!(matches!(
            f.get("general.architecture"),
            Some(Value::Str("llama"))
        ));
        assert!(matches!(f.get("llama.block_count"), Some(Value::Int(2))));
        let Some(Value::Array(tokens)) = f.get("tokenizer.ggml.tokens") else {
            panic!("no tokens")
        };
        assert_eq!(tokens.strings("t").unwrap(), vec!["a", "b", "ab"]);
        let t = f.tensor("x.weight").unwrap();
        assert_eq!(t.rows_cols(), (2, 4));
        assert_eq!(f.data(t).len(), 32);
        assert_eq!(t.offset % 32, 0);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama");
        w.kv_strs("tokenizer.ggml.tokens", &["x"; 20]);
        w.tensor_f32("x.weight", &[8, 2], &[0.5; 16]);
        let bytes = w.finish();
        for cut in 0..bytes.len() {
            assert!(GgufFile::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn garbled_counts_and_types_are_refused() {
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama");
        let mut bytes = w.finish();
        // The metadata count: 2^62 entries.
        bytes[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let e = GgufFile::parse(&bytes).unwrap_err().to_string();
        assert!(e.contains("metadata count"), "{e}");
        assert!(matches!(
            GgufFile::parse(b"GGML\0\0\0\0"),
            Err(GgufError::NotGguf)
        ));
        let mut v9 = b"GGUF".to_vec();
        v9.extend(9u32.to_le_bytes());
        v9.extend([0u8; 16]);
        let e = GgufFile::parse(&v9).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
    }
}

//! Dense tensors as bytes: an element type, a shape and the elements in
//! row-major order, little-endian — the form plugins exchange, files hold
//! (`.npy`, ONNX `TensorProto`) and the wire carries. The 4- and 2-bit
//! types are packed as ONNX packs them; strings are length-prefixed.
//!
//! Layout: this file holds [`Tensor`] and [`Element`]; `proto` converts from
//! and to ONNX `TensorProto`; `npy` reads and writes NumPy `.npy` files;
//! `strings` holds string tensors; `value` the sequences and optionals
//! ([`Value`]) that graphs may take and return.

mod npy;
mod proto;
mod strings;
mod value;

pub use npy::{read_npy, write_npy};
pub use value::Value;

use bytes::Bytes;

use crate::onnx::ElemType;

/// Why bytes could not become a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("{elem} tensor of shape {shape:?} needs {expected} bytes, got {got}")]
    Size {
        elem: String,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("element type {0} is not supported here")]
    UnsupportedType(String),
    #[error("tensor shape {0:?} is too large")]
    TooLarge(Vec<i64>),
    #[error("negative dimension in shape {0:?}")]
    NegativeDim(Vec<i64>),
    #[error("tensor is {actual}, not {requested}")]
    WrongType { actual: String, requested: String },
    #[error("not a valid .npy file: {0}")]
    Npy(String),
    #[error("tensor '{0}' keeps its data in an external file; load the model from its path")]
    External(String),
    #[error("not a valid string tensor: {0}")]
    Strings(String),
    #[error("a string of {0} bytes is too long for a tensor (at most 4 GiB)")]
    StringTooLong(usize),
}

/// A dense tensor. Its bytes are shared and immutable: a clone costs a
/// reference count, not a copy (intermediate tensors handed to several
/// consumers, or to the network, are not copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    elem: ElemType,
    shape: Vec<usize>,
    data: Bytes,
}

impl Tensor {
    /// A tensor over `data` (row-major, little-endian; sub-byte types
    /// packed; strings as [`Tensor::from_strings`] lays them out); the
    /// length must match. A `Vec<u8>` or `Bytes` is taken over without a
    /// copy.
    pub fn new(
        elem: ElemType,
        shape: Vec<usize>,
        data: impl Into<Bytes>,
    ) -> Result<Tensor, TensorError> {
        let data = data.into();
        if elem == ElemType::STRING {
            strings::check_strings(&shape, &data)?;
            return Ok(Tensor { elem, shape, data });
        }
        let too_large = || TensorError::TooLarge(shape.iter().map(|&d| d as i64).collect());
        let n = numel(&shape).ok_or_else(too_large)?;
        let expected = elem
            .data_len(n as u64)
            .ok_or_else(|| TensorError::UnsupportedType(elem.name()))?;
        let expected = usize::try_from(expected).map_err(|_| too_large())?;
        if data.len() != expected {
            return Err(TensorError::Size {
                elem: elem.name(),
                shape,
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor { elem, shape, data })
    }

    /// A tensor of `values`.
    pub fn from_values<T: Element>(shape: Vec<usize>, values: &[T]) -> Result<Tensor, TensorError> {
        let mut data = Vec::with_capacity(values.len() * T::SIZE);
        for v in values {
            v.write_le(&mut data);
        }
        Tensor::new(T::ELEM, shape, data)
    }

    pub fn elem(&self) -> ElemType {
        self.elem
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The bytes as a shared buffer (no copy).
    pub fn shared_bytes(&self) -> Bytes {
        self.data.clone()
    }

    /// The elements of an `int64` or `int32` tensor as `i64` (shapes, axes
    /// and indices); `None` for other element types.
    pub fn int_values(&self) -> Option<Vec<i64>> {
        match self.elem {
            ElemType::INT64 => self.to_vec::<i64>().ok(),
            ElemType::INT32 => self
                .to_vec::<i32>()
                .ok()
                .map(|v| v.into_iter().map(i64::from).collect()),
            _ => None,
        }
    }

    /// The elements of a `float` or `float16` tensor as `f32`; `None` for
    /// other element types.
    pub fn float_values(&self) -> Option<Vec<f32>> {
        match self.elem {
            ElemType::FLOAT => self.to_vec::<f32>().ok(),
            ElemType::FLOAT16 => self
                .to_vec::<half::f16>()
                .ok()
                .map(|v| v.into_iter().map(f32::from).collect()),
            _ => None,
        }
    }

    /// The elements as `T`, which must be the tensor's element type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        if self.elem != T::ELEM {
            return Err(TensorError::WrongType {
                actual: self.elem.name(),
                requested: T::ELEM.name(),
            });
        }
        Ok(self.data.chunks_exact(T::SIZE).map(T::read_le).collect())
    }
}

/// Product of dims, `None` on overflow.
fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// A Rust type that is an ONNX element type.
pub trait Element: Copy {
    const ELEM: ElemType;
    const SIZE: usize;
    fn read_le(bytes: &[u8]) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($t:ty, $elem:expr) => {
        impl Element for $t {
            const ELEM: ElemType = $elem;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(&bytes[..Self::SIZE]);
                <$t>::from_le_bytes(b)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}

element!(f32, ElemType::FLOAT);
element!(half::f16, ElemType::FLOAT16);
element!(f64, ElemType::DOUBLE);
element!(i8, ElemType::INT8);
element!(i16, ElemType::INT16);
element!(i32, ElemType::INT32);
element!(i64, ElemType::INT64);
element!(u8, ElemType::UINT8);
element!(u16, ElemType::UINT16);
element!(u32, ElemType::UINT32);
element!(u64, ElemType::UINT64);

impl Element for bool {
    const ELEM: ElemType = ElemType::BOOL;
    const SIZE: usize = 1;
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_sizes_are_checked() {
        let t = Tensor::from_values(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(t.to_vec::<f32>().unwrap()[5], 6.0);
        assert!(matches!(
            t.to_vec::<i64>(),
            Err(TensorError::WrongType { .. })
        ));
        let err = Tensor::new(ElemType::FLOAT, vec![2, 2], vec![0; 15]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "FLOAT tensor of shape [2, 2] needs 16 bytes, got 15"
        );
        let b = Tensor::from_values(vec![3], &[true, false, true]).unwrap();
        assert_eq!(b.bytes(), &[1, 0, 1]);
        assert!(Tensor::new(ElemType::FLOAT, vec![usize::MAX, 2], vec![]).is_err());
        assert!(Tensor::new(ElemType::STRING, vec![1], vec![0]).is_err());
        // Packed 4-bit: three elements in two bytes.
        assert!(Tensor::new(ElemType::INT4, vec![3], vec![0x21, 0x03]).is_ok());
        assert!(Tensor::new(ElemType::INT4, vec![3], vec![0; 3]).is_err());
        assert!(Tensor::new(ElemType::FLOAT8E4M3FN, vec![2], vec![0x38, 0xb8]).is_ok());
    }
}

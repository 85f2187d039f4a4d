//! String tensors. ONNX strings are byte strings (UTF-8 by convention, not
//! checked); a `STRING` tensor's data holds each element, in row-major
//! order, as its length (u32, little-endian) followed by its bytes, so that
//! it travels and concatenates like any other tensor's data.

use super::{numel, Tensor, TensorError};
use crate::onnx::ElemType;

impl Tensor {
    /// A `STRING` tensor of `values` (row-major).
    pub fn from_strings<S: AsRef<[u8]>>(
        shape: Vec<usize>,
        values: &[S],
    ) -> Result<Tensor, TensorError> {
        let size: usize = values.iter().map(|v| 4 + v.as_ref().len()).sum();
        let mut data = Vec::with_capacity(size);
        for v in values {
            let v = v.as_ref();
            let len = u32::try_from(v.len()).map_err(|_| TensorError::StringTooLong(v.len()))?;
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(v);
        }
        Tensor::new(ElemType::STRING, shape, data)
    }

    /// The elements of a `STRING` tensor, each as its bytes.
    pub fn strings(&self) -> Result<Vec<&[u8]>, TensorError> {
        if self.elem != ElemType::STRING {
            return Err(TensorError::WrongType {
                actual: self.elem.name(),
                requested: ElemType::STRING.name(),
            });
        }
        split_strings(&self.data, self.len())
    }
}

/// The `count` strings encoded in `data`, which must hold exactly them.
pub(super) fn split_strings(data: &[u8], count: usize) -> Result<Vec<&[u8]>, TensorError> {
    let bad = |why: &str| TensorError::Strings(why.to_string());
    let mut out = Vec::with_capacity(count.min(data.len() / 4));
    let mut rest = data;
    for _ in 0..count {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("the data ends inside a length"))?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(bad("the data ends inside a string"));
        }
        let (value, tail) = tail.split_at(len);
        out.push(value);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(bad("bytes left after the last string"));
    }
    Ok(out)
}

/// Checks that `data` holds exactly the strings of a tensor of `shape`.
pub(super) fn check_strings(shape: &[usize], data: &[u8]) -> Result<(), TensorError> {
    let count = numel(shape)
        .ok_or_else(|| TensorError::TooLarge(shape.iter().map(|&d| d as i64).collect()))?;
    split_strings(data, count).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_and_bad_encodings_are_refused() {
        let t = Tensor::from_strings(vec![2, 2], &["a", "", "héllo", "x y"]).unwrap();
        assert_eq!(t.elem(), ElemType::STRING);
        let got: Vec<&[u8]> = t.strings().unwrap();
        assert_eq!(got, [&b"a"[..], b"", "héllo".as_bytes(), b"x y"]);
        assert_eq!(Tensor::from_proto(&t.to_proto("s")).unwrap(), t);
        // Concatenated data is a longer tensor (what batching relies on).
        let mut two = t.bytes().to_vec();
        two.extend_from_slice(t.bytes());
        assert_eq!(
            Tensor::new(ElemType::STRING, vec![4, 2], two)
                .unwrap()
                .len(),
            8
        );
        for bad in [vec![1, 0, 0], vec![5, 0, 0, 0, b'a'], vec![0, 0, 0, 0, 9]] {
            let err = Tensor::new(ElemType::STRING, vec![1], bad).unwrap_err();
            assert!(matches!(err, TensorError::Strings(_)), "{err}");
        }
        assert!(Tensor::from_values(vec![1], &[1.0f32])
            .unwrap()
            .strings()
            .is_err());
        let empty = Tensor::from_strings::<&str>(vec![0, 3], &[]).unwrap();
        assert!(empty.bytes().is_empty());
    }
}

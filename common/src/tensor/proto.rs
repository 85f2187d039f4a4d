//! ONNX `TensorProto` ⇄ [`Tensor`].

use super::{numel, Tensor, TensorError};
use crate::onnx::proto::{tensor_proto::DataLocation, tensor_proto::DataType, TensorProto};
use crate::onnx::ElemType;

impl Tensor {
    /// Decodes a `TensorProto` (raw_data or the typed fields). External data
    /// must have been inlined (see [`crate::onnx::load_model`]).
    pub fn from_proto(t: &TensorProto) -> Result<Tensor, TensorError> {
        let name = t.name.clone().unwrap_or_default();
        if t.data_location == Some(DataLocation::External as i32) {
            return Err(TensorError::External(name));
        }
        let elem = ElemType(t.data_type.unwrap_or(0));
        let dims = &t.dims;
        if dims.iter().any(|&d| d < 0) {
            return Err(TensorError::NegativeDim(dims.clone()));
        }
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| TensorError::TooLarge(dims.clone())))
            .collect::<Result<_, _>>()?;
        let n = numel(&shape).ok_or_else(|| TensorError::TooLarge(dims.clone()))?;
        if elem == ElemType::STRING {
            return Tensor::from_strings(shape, &t.string_data);
        }
        if let Some(raw) = &t.raw_data {
            return Tensor::new(elem, shape, raw.clone());
        }
        let dt =
            DataType::try_from(elem.0).map_err(|_| TensorError::UnsupportedType(elem.name()))?;
        let mut data = Vec::new();
        use DataType as D;
        match dt {
            D::Float => t
                .float_data
                .iter()
                .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
            D::Double => t
                .double_data
                .iter()
                .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
            D::Int64 => t
                .int64_data
                .iter()
                .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
            D::Uint64 => t
                .uint64_data
                .iter()
                .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
            D::Uint32 => t
                .uint64_data
                .iter()
                .for_each(|&v| data.extend_from_slice(&(v as u32).to_le_bytes())),
            D::Int32 => t
                .int32_data
                .iter()
                .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
            // Narrow types are stored widened in int32_data.
            D::Int16 | D::Uint16 | D::Float16 | D::Bfloat16 => t
                .int32_data
                .iter()
                .for_each(|&v| data.extend_from_slice(&(v as u16).to_le_bytes())),
            // One byte each; the 4-bit types two to a byte, already packed.
            D::Int8
            | D::Uint8
            | D::Bool
            | D::Float8e4m3fn
            | D::Float8e4m3fnuz
            | D::Float8e5m2
            | D::Float8e5m2fnuz
            | D::Int4
            | D::Uint4 => t.int32_data.iter().for_each(|&v| data.push(v as u8)),
            _ => return Err(TensorError::UnsupportedType(elem.name())),
        }
        // Typed fields may be empty for a zero-sized tensor.
        if n == 0 {
            data.clear();
        }
        Tensor::new(elem, shape, data)
    }

    /// Encodes as a `TensorProto` with `raw_data` (strings in
    /// `string_data`).
    pub fn to_proto(&self, name: &str) -> TensorProto {
        if let Ok(strings) = self.strings() {
            return TensorProto {
                name: Some(name.to_string()),
                dims: self.shape.iter().map(|&d| d as i64).collect(),
                data_type: Some(self.elem.0),
                string_data: strings.into_iter().map(<[u8]>::to_vec).collect(),
                ..Default::default()
            };
        }
        TensorProto {
            name: Some(name.to_string()),
            dims: self.shape.iter().map(|&d| d as i64).collect(),
            data_type: Some(self.elem.0),
            raw_data: Some(self.data.clone()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_fields_and_raw_data_decode_alike() {
        let typed = TensorProto {
            dims: vec![2],
            data_type: Some(1),
            float_data: vec![1.5, -2.0],
            ..Default::default()
        };
        let t = Tensor::from_proto(&typed).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [1.5, -2.0]);
        let again = Tensor::from_proto(&t.to_proto("x")).unwrap();
        assert_eq!(again, t);
        let b = TensorProto {
            dims: vec![3],
            data_type: Some(9),
            int32_data: vec![1, 0, 1],
            ..Default::default()
        };
        assert_eq!(
            Tensor::from_proto(&b).unwrap().to_vec::<bool>().unwrap(),
            [true, false, true]
        );
        let short = TensorProto {
            dims: vec![3],
            data_type: Some(7),
            int64_data: vec![1],
            ..Default::default()
        };
        assert!(matches!(
            Tensor::from_proto(&short),
            Err(TensorError::Size { .. })
        ));
        let neg = TensorProto {
            dims: vec![-1],
            data_type: Some(1),
            ..Default::default()
        };
        assert!(matches!(
            Tensor::from_proto(&neg),
            Err(TensorError::NegativeDim(_))
        ));
        let s = TensorProto {
            dims: vec![2],
            data_type: Some(8),
            string_data: vec![b"a".to_vec(), b"bc".to_vec()],
            ..Default::default()
        };
        let strings = Tensor::from_proto(&s).unwrap();
        assert_eq!(strings.strings().unwrap(), [&b"a"[..], b"bc"]);
        let int4 = TensorProto {
            dims: vec![3],
            data_type: Some(22),
            int32_data: vec![0x21, 0x0f],
            ..Default::default()
        };
        assert_eq!(Tensor::from_proto(&int4).unwrap().bytes(), [0x21, 0x0f]);
    }
}

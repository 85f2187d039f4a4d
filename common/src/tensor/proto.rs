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
            D::Int8 | D::Uint8 | D::Bool => t.int32_data.iter().for_each(|&v| data.push(v as u8)),
            _ => return Err(TensorError::UnsupportedType(elem.name())),
        }
        // Typed fields may be empty for a zero-sized tensor.
        if n == 0 {
            data.clear();
        }
        Tensor::new(elem, shape, data)
    }

    /// Encodes as a `TensorProto` with `raw_data`.
    pub fn to_proto(&self, name: &str) -> TensorProto {
        TensorProto {
            name: Some(name.to_string()),
            dims: self.shape.iter().map(|&d| d as i64).collect(),
            data_type: Some(self.elem.0),
            raw_data: Some(self.data.to_vec()),
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
            dims: vec![1],
            data_type: Some(8),
            string_data: vec![b"a".to_vec()],
            ..Default::default()
        };
        assert!(matches!(
            Tensor::from_proto(&s),
            Err(TensorError::UnsupportedType(_))
        ));
    }
}

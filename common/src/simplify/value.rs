//! Constant values the folder computes with: a shape and the elements
//! widened to `i64`, `f64` or `bool`, tagged with the ONNX element type they
//! are written back as. Widening is exact for every integer type up to 64
//! bits (u64 past `i64::MAX` is refused) and for float16/float/double;
//! results are rounded back to the element type once, so `+ - * /` and
//! `sqrt` on float give the same bits as the runtime would.

use crate::onnx::proto::TensorProto;
use crate::onnx::ElemType;
use crate::tensor::{Element, Tensor};

/// The elements of a constant.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
}

/// A constant tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    pub elem: ElemType,
    pub shape: Vec<usize>,
    pub data: Data,
}

/// What kind of elements an ONNX element type holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Bool,
}

/// The kind of `elem`; `None` for strings, complex and sub-byte types.
pub fn kind(elem: ElemType) -> Option<Kind> {
    match elem {
        ElemType::UINT8
        | ElemType::INT8
        | ElemType::UINT16
        | ElemType::INT16
        | ElemType::INT32
        | ElemType::INT64
        | ElemType::UINT32
        | ElemType::UINT64 => Some(Kind::Int),
        ElemType::FLOAT | ElemType::FLOAT16 | ElemType::DOUBLE | ElemType::BFLOAT16 => {
            Some(Kind::Float)
        }
        ElemType::BOOL => Some(Kind::Bool),
        _ => None,
    }
}

fn ints<T: Element + Into<i64>>(t: &Tensor) -> Option<Data> {
    Some(Data::Int(
        t.to_vec::<T>().ok()?.into_iter().map(Into::into).collect(),
    ))
}

impl Value {
    /// An int64 vector.
    pub fn ints(values: Vec<i64>) -> Value {
        Value {
            elem: ElemType::INT64,
            shape: vec![values.len()],
            data: Data::Int(values),
        }
    }

    /// A value of `elem`, stored as that type would store it (see
    /// [`Value::wrapped`]).
    pub fn new(elem: ElemType, shape: Vec<usize>, data: Data) -> Value {
        Value { elem, shape, data }.wrapped()
    }

    /// Results computed in `f64` as a value of `elem`: floats rounded to
    /// it, integers where exactly representable (else `None`).
    pub fn from_f64(elem: ElemType, shape: Vec<usize>, values: Vec<f64>) -> Option<Value> {
        let data = match kind(elem)? {
            Kind::Float => Data::Float(values),
            Kind::Int => Data::Int(
                values
                    .into_iter()
                    .map(|v| (v.is_finite() && v.abs() < 9.0e15).then_some(v as i64))
                    .collect::<Option<_>>()?,
            ),
            Kind::Bool => return None,
        };
        Some(Value::new(elem, shape, data))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Int(v) => v.len(),
            Data::Float(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of an ONNX tensor, where its type is one the folder
    /// computes with.
    pub fn from_proto(t: &TensorProto) -> Option<Value> {
        Value::from_tensor(&Tensor::from_proto(t).ok()?)
    }

    pub fn from_tensor(t: &Tensor) -> Option<Value> {
        let data = match t.elem() {
            ElemType::FLOAT => {
                Data::Float(t.to_vec::<f32>().ok()?.into_iter().map(f64::from).collect())
            }
            ElemType::FLOAT16 => Data::Float(
                t.to_vec::<half::f16>()
                    .ok()?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            ),
            ElemType::DOUBLE => Data::Float(t.to_vec::<f64>().ok()?),
            ElemType::UINT8 => ints::<u8>(t)?,
            ElemType::INT8 => ints::<i8>(t)?,
            ElemType::UINT16 => ints::<u16>(t)?,
            ElemType::INT16 => ints::<i16>(t)?,
            ElemType::INT32 => ints::<i32>(t)?,
            ElemType::INT64 => ints::<i64>(t)?,
            ElemType::UINT32 => ints::<u32>(t)?,
            ElemType::UINT64 => Data::Int(
                t.to_vec::<u64>()
                    .ok()?
                    .into_iter()
                    .map(i64::try_from)
                    .collect::<Result<_, _>>()
                    .ok()?,
            ),
            ElemType::BOOL => Data::Bool(t.to_vec::<bool>().ok()?),
            _ => return None,
        };
        Some(Value {
            elem: t.elem(),
            shape: t.shape().to_vec(),
            data,
        })
    }

    /// The value as a dense tensor of its element type.
    pub fn to_tensor(&self) -> Option<Tensor> {
        let shape = self.shape.clone();
        let r = match (&self.data, self.elem.0) {
            (Data::Float(v), 1) => Tensor::from_values(shape, &map(v, |x| x as f32)),
            (Data::Float(v), 10) => Tensor::from_values(shape, &map(v, half::f16::from_f64)),
            (Data::Float(v), 11) => Tensor::from_values(shape, v),
            (Data::Int(v), 2) => Tensor::from_values(shape, &map(v, |x| x as u8)),
            (Data::Int(v), 3) => Tensor::from_values(shape, &map(v, |x| x as i8)),
            (Data::Int(v), 4) => Tensor::from_values(shape, &map(v, |x| x as u16)),
            (Data::Int(v), 5) => Tensor::from_values(shape, &map(v, |x| x as i16)),
            (Data::Int(v), 6) => Tensor::from_values(shape, &map(v, |x| x as i32)),
            (Data::Int(v), 7) => Tensor::from_values(shape, v),
            (Data::Int(v), 12) => Tensor::from_values(shape, &map(v, |x| x as u32)),
            (Data::Int(v), 13) => Tensor::from_values(shape, &map(v, |x| x as u64)),
            (Data::Bool(v), 9) => Tensor::from_values(shape, v),
            _ => return None,
        };
        r.ok()
    }

    /// The elements as integers (int tensors only).
    pub fn as_ints(&self) -> Option<&[i64]> {
        match &self.data {
            Data::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as `f64`, whatever the kind.
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::Int(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Float(v) => v.clone(),
            Data::Bool(v) => v.iter().map(|&b| f64::from(u8::from(b))).collect(),
        }
    }

    /// The value converted to `elem` as ONNX `Cast` does (float to int
    /// truncates toward zero; integers wrap to the target width).
    pub fn cast(&self, elem: ElemType) -> Option<Value> {
        let data = match kind(elem)? {
            Kind::Float => Data::Float(self.to_f64()),
            Kind::Bool => Data::Bool(self.to_f64().into_iter().map(|x| x != 0.0).collect()),
            Kind::Int => Data::Int(match &self.data {
                Data::Int(v) => v.clone(),
                Data::Float(v) => v
                    .iter()
                    .map(|&x| x.is_finite().then_some(x.trunc() as i64))
                    .collect::<Option<_>>()?,
                Data::Bool(v) => v.iter().map(|&b| i64::from(b)).collect(),
            }),
        };
        Some(
            Value {
                elem,
                shape: self.shape.clone(),
                data,
            }
            .wrapped(),
        )
    }

    /// Integers wrapped to the width of the element type, floats rounded to
    /// it (what storing the value would do).
    pub fn wrapped(mut self) -> Value {
        match &mut self.data {
            Data::Int(v) => {
                let wrap: fn(i64) -> i64 = match self.elem {
                    ElemType::UINT8 => |x| x as u8 as i64,
                    ElemType::INT8 => |x| x as i8 as i64,
                    ElemType::UINT16 => |x| x as u16 as i64,
                    ElemType::INT16 => |x| x as i16 as i64,
                    ElemType::INT32 => |x| x as i32 as i64,
                    ElemType::UINT32 => |x| x as u32 as i64,
                    _ => |x| x,
                };
                v.iter_mut().for_each(|x| *x = wrap(*x));
            }
            Data::Float(v) => {
                let round: fn(f64) -> f64 = match self.elem {
                    ElemType::FLOAT => |x| x as f32 as f64,
                    ElemType::FLOAT16 => |x| f64::from(half::f16::from_f64(x)),
                    _ => |x| x,
                };
                v.iter_mut().for_each(|x| *x = round(*x));
            }
            Data::Bool(_) => {}
        }
        self
    }

    /// The value reshaped (same elements).
    pub fn reshaped(mut self, shape: Vec<usize>) -> Option<Value> {
        (shape.iter().product::<usize>() == self.len()).then(|| {
            self.shape = shape;
            self
        })
    }

    /// The elements at `indices` (flat positions), in that order.
    pub fn pick(&self, indices: &[usize], shape: Vec<usize>) -> Option<Value> {
        let data = match &self.data {
            Data::Int(v) => Data::Int(pick(v, indices)?),
            Data::Float(v) => Data::Float(pick(v, indices)?),
            Data::Bool(v) => Data::Bool(pick(v, indices)?),
        };
        Some(Value {
            elem: self.elem,
            shape,
            data,
        })
    }
}

fn map<A: Copy, B>(v: &[A], f: impl Fn(A) -> B) -> Vec<B> {
    v.iter().map(|&x| f(x)).collect()
}

fn pick<T: Clone>(v: &[T], indices: &[usize]) -> Option<Vec<T>> {
    indices.iter().map(|&i| v.get(i).cloned()).collect()
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Every multi-index of `shape`, in row-major order, as a flat iterator of
/// index vectors.
pub fn indices(shape: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let total: usize = shape.iter().product();
    let strides = strides(shape);
    (0..total).map(move |flat| {
        strides
            .iter()
            .zip(shape)
            .map(|(&s, &d)| if d == 0 { 0 } else { (flat / s) % d })
            .collect()
    })
}

/// `shape` without the dims at `axes`.
pub fn drop_axes(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect()
}

/// `axis` (negative counts from the end) as an index below `rank`.
pub fn axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 {
        axis.checked_add(rank as i64)?
    } else {
        axis
    };
    usize::try_from(a).ok().filter(|&a| a < rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_casts() {
        let t = Tensor::from_values(vec![3], &[1.5f32, -2.7, 3.0]).unwrap();
        let v = Value::from_tensor(&t).unwrap();
        assert_eq!(v.to_tensor().unwrap(), t);
        let i = v.cast(ElemType::INT64).unwrap();
        assert_eq!(i.as_ints().unwrap(), &[1, -2, 3]);
        let b = Value::ints(vec![0, 3]).cast(ElemType::BOOL).unwrap();
        assert_eq!(b.data, Data::Bool(vec![false, true]));
        let w = Value::ints(vec![300]).cast(ElemType::UINT8).unwrap();
        assert_eq!(w.as_ints().unwrap(), &[44]);
        assert_eq!(indices(&[2, 2]).collect::<Vec<_>>().len(), 4);
        assert_eq!(axis(-1, 3), Some(2));
        assert_eq!(axis(3, 3), None);
    }
}

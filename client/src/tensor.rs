//! Tensors from and to `ndarray` arrays.

use ndarray::{ArrayD, IxDyn};
pub use tessera_common::tensor::{Element, Tensor};

use crate::ClientError;

/// A tensor with the array's shape and elements (row-major).
pub fn from_array<T: Element + Clone>(array: &ArrayD<T>) -> Result<Tensor, ClientError> {
    let values: Vec<T> = array.iter().cloned().collect();
    Tensor::from_values(array.shape().to_vec(), &values)
        .map_err(|e| ClientError::Tensor(e.to_string()))
}

/// The tensor as an array; `T` must be its element type.
pub fn to_array<T: Element>(tensor: &Tensor) -> Result<ArrayD<T>, ClientError> {
    let values = tensor
        .to_vec::<T>()
        .map_err(|e| ClientError::Tensor(e.to_string()))?;
    ArrayD::from_shape_vec(IxDyn(tensor.shape()), values)
        .map_err(|e| ClientError::Tensor(e.to_string()))
}

//! Tensor frames: a small header (which request, which tensor, type and
//! shape) and the raw little-endian bytes as the payload.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::frame::{FrameKind, Limits};
use super::{codec, WireError};
use crate::onnx::ElemType;
use crate::tensor::Tensor;

/// The tensor name of a request's trigger: the coordinator sends it to each
/// subgraph that takes no input tensors (only constants), so it runs once
/// for the request. No ONNX tensor has the empty name.
pub const TRIGGER: &str = "";

/// The header of a tensor frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorHeader {
    /// The loaded network the request belongs to.
    pub network: u64,
    /// The request.
    pub request: u64,
    /// The tensor's ONNX name.
    pub name: String,
    /// ONNX element type number.
    pub elem: i32,
    pub shape: Vec<u64>,
}

impl TensorHeader {
    /// The header for sending `tensor` as `name` of `request`.
    pub fn new(network: u64, request: u64, name: &str, tensor: &Tensor) -> TensorHeader {
        TensorHeader {
            network,
            request,
            name: name.into(),
            elem: tensor.elem().0,
            shape: tensor.shape().iter().map(|&d| d as u64).collect(),
        }
    }

    fn error(&self, reason: impl Into<String>) -> WireError {
        WireError::Tensor {
            name: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// The payload size this header announces.
    pub fn byte_len(&self) -> Result<u64, WireError> {
        let size = ElemType(self.elem)
            .size_bytes()
            .ok_or_else(|| self.error(format!("element type {} has no fixed size", self.elem)))?;
        self.shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.error(format!("shape {:?} overflows", self.shape)))
    }

    /// Checks that a payload of `len` bytes is what the header announces.
    pub fn check_payload(&self, len: u64) -> Result<(), WireError> {
        let expected = self.byte_len()?;
        if expected != len {
            return Err(self.error(format!(
                "{} {:?} needs {expected} bytes, the frame carries {len}",
                ElemType(self.elem),
                self.shape
            )));
        }
        Ok(())
    }

    /// The frame's prefix and header; the tensor's bytes follow.
    pub fn encode(&self, limits: &Limits) -> Result<Vec<u8>, WireError> {
        codec::encode_frame(FrameKind::Tensor, self, self.byte_len()?, limits)
    }

    /// The tensor, over the payload's bytes (no copy).
    pub fn into_tensor(self, payload: Bytes) -> Result<Tensor, WireError> {
        self.check_payload(payload.len() as u64)?;
        let shape = self
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| self.error("shape does not fit this machine"))?;
        Tensor::new(ElemType(self.elem), shape, payload).map_err(|e| self.error(e.to_string()))
    }
}

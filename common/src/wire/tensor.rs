//! Tensor frames: a small header (which request, which tensor, type and
//! shape) and the raw little-endian bytes as the payload.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::frame::{FrameKind, Limits};
use super::generate::Steps;
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
    /// The payload's length in bytes: what the type and shape make for
    /// fixed-size and packed types, the encoded strings' for `STRING`.
    pub bytes: u64,
    /// The sequence steps the request is, one per row (absent: a
    /// stateless request).
    pub sequence: Option<Steps>,
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
            bytes: tensor.bytes().len() as u64,
            sequence: None,
        }
    }

    /// The same header, for a request that is `sequence`'s steps.
    pub fn in_sequence(mut self, sequence: Option<Steps>) -> TensorHeader {
        self.sequence = sequence;
        self
    }

    fn error(&self, reason: impl Into<String>) -> WireError {
        WireError::Tensor {
            name: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// The payload size this header announces, checked against its type
    /// and shape where they fix it (a string tensor's data is checked when
    /// it becomes a tensor).
    pub fn byte_len(&self) -> Result<u64, WireError> {
        let elem = ElemType(self.elem);
        let numel = self
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.error(format!("shape {:?} overflows", self.shape)))?;
        if elem == ElemType::STRING {
            // At least a length per string.
            if numel.checked_mul(4).is_none_or(|least| self.bytes < least) {
                return Err(self.error(format!(
                    "{numel} strings cannot fit in {} bytes",
                    self.bytes
                )));
            }
            return Ok(self.bytes);
        }
        let fixed = elem
            .data_len(numel)
            .ok_or_else(|| self.error(format!("element type {elem} is not carried")))?;
        if fixed != self.bytes {
            return Err(self.error(format!(
                "{elem} {:?} needs {fixed} bytes, the header says {}",
                self.shape, self.bytes
            )));
        }
        Ok(fixed)
    }

    /// Checks that a payload of `len` bytes is what the header announces.
    pub fn check_payload(&self, len: u64) -> Result<(), WireError> {
        if let Some(steps) = &self.sequence {
            steps.check().map_err(|e| self.error(e.to_string()))?;
        }
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

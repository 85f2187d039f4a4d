//! Tensors read by name from a GGUF, their shapes and types checked; each
//! one's pages of the memory map are given back once it is a weight.

use bytes::Bytes;
use tessera_common::onnx::ElemType;

use crate::file::{GgufFile, TensorInfo};
use crate::graph::embedding::Table;
use crate::quant::{self, Weight};
use crate::types::GgmlType;
use crate::GgufError;

/// Reads tensors by name, checking shapes and types, and tells the
/// memory map once a tensor's bytes have been turned into a weight.
pub(super) struct Tensors<'f, 'a> {
    pub(super) file: &'f GgufFile<'a>,
    /// Keep the types with kernels as the file's blocks.
    pub(super) native: bool,
    pub(super) release: &'f dyn Fn(&TensorInfo<'_>),
    pub(super) used: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl Tensors<'_, '_> {
    pub(super) fn info(&self, name: &str) -> Result<Option<&TensorInfo<'_>>, GgufError> {
        let t = self.file.tensor(name);
        if t.is_some() {
            self.used.borrow_mut().insert(name.to_string());
        }
        Ok(t)
    }

    pub(super) fn require(&self, name: &str) -> Result<&TensorInfo<'_>, GgufError> {
        self.info(name)?.ok_or_else(|| GgufError::Tensor {
            name: name.to_string(),
            reason: "missing".into(),
        })
    }

    pub(super) fn check_shape(t: &TensorInfo<'_>, want: &[usize]) -> Result<(), GgufError> {
        let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        if dims != want {
            return Err(GgufError::Tensor {
                name: t.name.to_string(),
                reason: format!("shape {dims:?} (ggml order), expected {want:?}"),
            });
        }
        Ok(())
    }

    /// A `[rows, cols]` matrix as a weight.
    pub(super) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, GgufError> {
        let t = self.require(name)?;
        self.matrix_of(t, rows, cols)
    }

    pub(super) fn matrix_of(
        &self,
        t: &TensorInfo<'_>,
        rows: usize,
        cols: usize,
    ) -> Result<Weight, GgufError> {
        Self::check_shape(t, &[cols, rows])?;
        let w =
            quant::weight_for(t.ty, self.file.data(t), (rows, cols), self.native).map_err(|e| {
                GgufError::Tensor {
                    name: t.name.to_string(),
                    reason: e.to_string(),
                }
            })?;
        (self.release)(t);
        Ok(w)
    }

    /// A vector (norm weights, biases, RoPE factors) as float32.
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(t) = self.info(name)? else {
            return Ok(None);
        };
        Self::check_shape(t, &[len])?;
        let bytes = self.file.data(t);
        let values = match t.ty {
            GgmlType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            GgmlType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            GgmlType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(GgufError::Tensor {
                    name: name.to_string(),
                    reason: format!("a vector of type {other} (F32, F16 or BF16 are read)"),
                })
            }
        };
        Ok(Some(values))
    }

    pub(super) fn required_vector(&self, name: &str, len: usize) -> Result<Vec<f32>, GgufError> {
        self.vector(name, len)?.ok_or_else(|| GgufError::Tensor {
            name: name.to_string(),
            reason: "missing".into(),
        })
    }

    /// The token embedding `[vocab, hidden]` in its type.
    pub(super) fn embedding(&self, hidden: usize) -> Result<Table, GgufError> {
        let t = self.require("token_embd.weight")?;
        let (vocab, _) = t.rows_cols();
        Self::check_shape(t, &[hidden, vocab])?;
        let dense = [
            (GgmlType::F32, ElemType::FLOAT),
            (GgmlType::F16, ElemType::FLOAT16),
            (GgmlType::BF16, ElemType::BFLOAT16),
        ];
        if let Some((_, elem)) = dense.iter().find(|(ty, _)| *ty == t.ty) {
            let data = Bytes::copy_from_slice(self.file.data(t));
            (self.release)(t);
            return Ok(Table::Dense {
                elem: *elem,
                rows: vocab,
                cols: hidden,
                data,
            });
        }
        match self.matrix_of(t, vocab, hidden)? {
            Weight::Packed(p) => Ok(Table::Packed(p)),
            Weight::Native(n) => Ok(Table::Native(n)),
            Weight::Dense(_) => unreachable!("float embeddings are kept as rows above"),
        }
    }

    /// Tensors of the file nothing read.
    pub(super) fn unused(&self) -> Vec<&str> {
        let used = self.used.borrow();
        self.file
            .tensors()
            .iter()
            .map(|t| t.name)
            .filter(|n| !used.contains(*n))
            .collect()
    }

    /// A `[count, rows, cols]` tensor of experts' matrices: its type and
    /// each expert's bytes (the file's, borrowed).
    pub(super) fn experts(
        &self,
        name: &str,
        (count, rows, cols): (usize, usize, usize),
    ) -> Result<Option<ExpertTensor<'_>>, GgufError> {
        let Some(t) = self.info(name)? else {
            return Ok(None);
        };
        Self::check_shape(t, &[cols, rows, count])?;
        let data = self.file.data(t);
        let per = data.len() / count;
        Ok(Some(ExpertTensor {
            info: t,
            ty: t.ty,
            parts: data.chunks_exact(per).collect(),
        }))
    }

    /// Gives back the memory map's pages of a tensor read.
    pub(super) fn done(&self, t: &TensorInfo<'_>) {
        (self.release)(t);
    }

    /// One expert's matrix as a weight.
    pub(super) fn expert_weight(
        &self,
        e: &ExpertTensor<'_>,
        i: usize,
        (rows, cols): (usize, usize),
    ) -> Result<Weight, GgufError> {
        quant::weight_for(e.ty, e.parts[i], (rows, cols), self.native).map_err(|err| {
            GgufError::Tensor {
                name: e.info.name.to_string(),
                reason: err.to_string(),
            }
        })
    }
}

/// A 3-D tensor of experts' matrices.
pub(super) struct ExpertTensor<'t> {
    pub info: &'t TensorInfo<'t>,
    pub ty: GgmlType,
    /// Each expert's bytes.
    pub parts: Vec<&'t [u8]>,
}

//! Tessera's kernels over llama.cpp's weight blocks
//! (`tessera_gguf::kernels`) as onnxruntime custom operators of the
//! `ai.tessera.ggml` domain, registered on every session this plugin
//! builds (and so on QueryNetwork's probes):
//!
//! - `MatMul(x float [.., K], blocks uint8 [N, bytes]) -> float [.., N]`,
//!   attributes `type` (ggml's type number), `K`, `N`: `x · Wᵀ`, the
//!   weight rows split over the session's intra-op threads;
//! - `Gather(blocks uint8 [rows, bytes], indices int64 [..]) -> float
//!   [.., K]`, attributes `type`, `K`: rows dequantized (a token
//!   embedding's lookup);
//! - `MatMulExperts(x float [.., K] or [.., slots, K], ids int64 [..,
//!   slots], blocks uint8 [experts × N, bytes]) -> float [.., slots, N]`,
//!   attributes `type`, `K`, `N`, `experts`: each token's chosen experts'
//!   products (ggml's `mul_mat_id`).
//!
//! A malformed node (an unknown type, blocks of the wrong length, an
//! index outside the table) fails its run with the reason.

use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::TensorElementType;
use tessera_gguf::kernels::{self, Blocks, ExpertInput};
use tessera_gguf::types::GgmlType;

/// The domain with both operators.
pub(super) fn domain() -> ort::Result<OperatorDomain> {
    OperatorDomain::new(kernels::DOMAIN)?
        .add(MatMulOp)?
        .add(GatherOp)?
        .add(MatMulExpertsOp)
}

/// `job` over the session's intra-op threads; the first failure to spread
/// them is kept in `failed`.
fn spread<'c>(
    ctx: &'c ComputeContext,
    failed: &'c std::cell::RefCell<Option<ort::Error>>,
) -> impl Fn(usize, &(dyn Fn(usize) + Sync)) + 'c {
    move |jobs, job| {
        if let Err(e) = ctx.par_for(jobs, jobs, job) {
            *failed.borrow_mut() = Some(e);
        }
    }
}

fn failed(e: impl std::fmt::Display) -> ort::Error {
    ort::Error::new(e.to_string())
}

/// An integer attribute of a node.
fn attribute(ctx: &KernelContext<'_>, name: &str) -> ort::Result<i64> {
    ctx.get::<i64>(name)
        .ok_or_else(|| failed(format!("the node has no integer attribute {name}")))
}

fn count(ctx: &KernelContext<'_>, name: &str) -> ort::Result<usize> {
    let v = attribute(ctx, name)?;
    usize::try_from(v)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| failed(format!("attribute {name} is {v}")))
}

fn weight_type(ctx: &KernelContext<'_>) -> ort::Result<GgmlType> {
    let ty = attribute(ctx, "type")?;
    u32::try_from(ty)
        .map(GgmlType)
        .map_err(|_| failed(format!("attribute type is {ty}")))
}

struct MatMulOp;

struct MatMulKernel {
    ty: GgmlType,
    k: usize,
    n: usize,
}

impl Operator for MatMulOp {
    type Kernel<'attr> = MatMulKernel;

    fn name(&self) -> &str {
        kernels::MATMUL
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Uint8),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, ctx: &KernelContext<'attr>) -> ort::Result<MatMulKernel> {
        Ok(MatMulKernel {
            ty: weight_type(ctx)?,
            k: count(ctx, "K")?,
            n: count(ctx, "N")?,
        })
    }
}

impl Kernel for MatMulKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let missing = || failed("an input is missing");
        let x = ctx.input(0)?.ok_or_else(missing)?;
        let (shape, x) = x.try_extract_tensor::<f32>()?;
        let w = ctx.input(1)?.ok_or_else(missing)?;
        let (_, w) = w.try_extract_tensor::<u8>()?;
        let blocks = Blocks::new(self.ty, self.n, self.k, w).map_err(failed)?;
        if shape.last().copied() != Some(self.k as i64) {
            return Err(failed(format!(
                "an input of shape {shape:?} for K = {}",
                self.k
            )));
        }
        let mut out_shape: Vec<i64> = shape.to_vec();
        if let Some(last) = out_shape.last_mut() {
            *last = self.n as i64;
        }
        let mut y = ctx
            .output(0, out_shape)?
            .ok_or_else(|| failed("no output"))?;
        let (_, y) = y.try_extract_tensor_mut::<f32>()?;
        let parallel_failed = std::cell::RefCell::new(None);
        kernels::matmul(&blocks, x, y, &spread(ctx, &parallel_failed)).map_err(failed)?;
        parallel_failed.into_inner().map_or(Ok(()), Err)
    }
}

struct GatherOp;

struct GatherKernel {
    ty: GgmlType,
    k: usize,
}

impl Operator for GatherOp {
    type Kernel<'attr> = GatherKernel;

    fn name(&self) -> &str {
        kernels::GATHER
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Uint8),
            OperatorInput::required(TensorElementType::Int64),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, ctx: &KernelContext<'attr>) -> ort::Result<GatherKernel> {
        Ok(GatherKernel {
            ty: weight_type(ctx)?,
            k: count(ctx, "K")?,
        })
    }
}

impl Kernel for GatherKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let missing = || failed("an input is missing");
        let w = ctx.input(0)?.ok_or_else(missing)?;
        let (w_shape, w) = w.try_extract_tensor::<u8>()?;
        let indices = ctx.input(1)?.ok_or_else(missing)?;
        let (shape, indices) = indices.try_extract_tensor::<i64>()?;
        let rows = w_shape.first().copied().unwrap_or(0).max(0) as usize;
        let blocks = Blocks::new(self.ty, rows, self.k, w).map_err(failed)?;
        let mut out_shape: Vec<i64> = shape.to_vec();
        out_shape.push(self.k as i64);
        let mut y = ctx
            .output(0, out_shape)?
            .ok_or_else(|| failed("no output"))?;
        let (_, y) = y.try_extract_tensor_mut::<f32>()?;
        kernels::gather(&blocks, indices, y).map_err(failed)
    }
}

struct MatMulExpertsOp;

struct MatMulExpertsKernel {
    ty: GgmlType,
    k: usize,
    n: usize,
    experts: usize,
}

impl Operator for MatMulExpertsOp {
    type Kernel<'attr> = MatMulExpertsKernel;

    fn name(&self) -> &str {
        kernels::MATMUL_EXPERTS
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Int64),
            OperatorInput::required(TensorElementType::Uint8),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, ctx: &KernelContext<'attr>) -> ort::Result<MatMulExpertsKernel> {
        Ok(MatMulExpertsKernel {
            ty: weight_type(ctx)?,
            k: count(ctx, "K")?,
            n: count(ctx, "N")?,
            experts: count(ctx, "experts")?,
        })
    }
}

impl Kernel for MatMulExpertsKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let missing = || failed("an input is missing");
        let x = ctx.input(0)?.ok_or_else(missing)?;
        let (x_shape, x) = x.try_extract_tensor::<f32>()?;
        let ids = ctx.input(1)?.ok_or_else(missing)?;
        let (ids_shape, ids) = ids.try_extract_tensor::<i64>()?;
        let w = ctx.input(2)?.ok_or_else(missing)?;
        let (_, w) = w.try_extract_tensor::<u8>()?;
        let blocks = Blocks::new(self.ty, self.experts * self.n, self.k, w).map_err(failed)?;
        let (Some((&k, rows)), Some((&slots, tokens))) =
            (x_shape.split_last(), ids_shape.split_last())
        else {
            return Err(failed("scalar inputs"));
        };
        // x is one row a token, or one a token and slot.
        let per_slot = rows == &ids_shape[..];
        if k != self.k as i64 || (!per_slot && rows != tokens) || slots <= 0 {
            return Err(failed(format!(
                "inputs of shapes {x_shape:?} and ids {ids_shape:?} for K = {}",
                self.k
            )));
        }
        let mut out_shape: Vec<i64> = ids_shape.to_vec();
        out_shape.push(self.n as i64);
        let mut y = ctx
            .output(0, out_shape)?
            .ok_or_else(|| failed("no output"))?;
        let (_, y) = y.try_extract_tensor_mut::<f32>()?;
        let input = ExpertInput {
            x,
            ids,
            slots: slots as usize,
            per_slot,
        };
        let parallel_failed = std::cell::RefCell::new(None);
        kernels::matmul_experts(
            &blocks,
            self.experts,
            &input,
            y,
            &spread(ctx, &parallel_failed),
        )
        .map_err(failed)?;
        parallel_failed.into_inner().map_or(Ok(()), Err)
    }
}

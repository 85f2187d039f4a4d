//! ggml's `mul_mat_id`: each token multiplied by the matrices of the
//! experts its router chose, from one tensor of every expert's blocks
//! (`experts × n` rows). Work is grouped by expert: each chosen expert's
//! rows pass once over the activation rows sent to it, in jobs of
//! [`ROWS_PER_JOB`](super::ROWS_PER_JOB) rows as a plain product's.

use super::{
    has_kernel, products, quantize, row_groups, simd, Activations, Blocks, KernelError, Parallel,
    SharedOut, ROWS_PER_JOB,
};

/// The activations of [`matmul_experts`]: `tokens × slots` chosen expert
/// ids, and `x`, one row per token (every slot of a token multiplies the
/// same row: gate and up) or one per token and slot (down).
pub struct ExpertInput<'a> {
    pub x: &'a [f32],
    pub ids: &'a [i64],
    pub slots: usize,
    pub per_slot: bool,
}

/// `y[t, s] = x[t (, s)] · W_{ids[t, s]}ᵀ` (`tokens × slots` rows of
/// `n = w.rows / experts`): `w` holds each expert's `n` rows in turn.
pub fn matmul_experts(
    w: &Blocks<'_>,
    experts: usize,
    input: &ExpertInput<'_>,
    y: &mut [f32],
    parallel: Parallel<'_>,
) -> Result<(), KernelError> {
    if !has_kernel(w.ty) {
        return Err(KernelError::Type(w.ty.name()));
    }
    let bad = |what: String| Err(KernelError::Shape(what));
    if experts == 0 || !w.rows.is_multiple_of(experts) {
        return bad(format!("{} rows for {experts} experts", w.rows));
    }
    let n = w.rows / experts;
    let ExpertInput {
        x,
        ids,
        slots,
        per_slot,
    } = *input;
    if slots == 0 || !ids.len().is_multiple_of(slots) {
        return bad(format!("{} expert ids for {slots} a token", ids.len()));
    }
    let rows = if per_slot {
        ids.len()
    } else {
        ids.len() / slots
    };
    if x.len() != rows * w.cols || y.len() != ids.len() * n {
        return bad(format!(
            "{} inputs and {} outputs for {} ids of {slots} a token, K = {}, N = {n}",
            x.len(),
            y.len(),
            ids.len(),
            w.cols
        ));
    }
    // Each expert's (output row, activation row) pairs.
    let mut sent: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts];
    for (i, &id) in ids.iter().enumerate() {
        let e = usize::try_from(id)
            .ok()
            .filter(|&e| e < experts)
            .ok_or(KernelError::Index {
                index: id,
                rows: experts,
            })?;
        sent[e].push((i, if per_slot { i } else { i / slots }));
    }
    let activations: Vec<Activations> = x
        .chunks_exact(w.cols)
        .map(|row| quantize(w.ty, row))
        .collect();
    let simd = simd();
    let chosen: Vec<usize> = (0..experts).filter(|&e| !sent[e].is_empty()).collect();
    let inputs: Vec<Vec<&Activations>> = chosen
        .iter()
        .map(|&e| sent[e].iter().map(|&(_, a)| &activations[a]).collect())
        .collect();
    let groups: Vec<_> = inputs
        .iter()
        .map(|acts| row_groups(w.ty, acts, simd))
        .collect();
    let chunks = n.div_ceil(ROWS_PER_JOB);
    let out = SharedOut(y.as_mut_ptr());
    let job = |j: usize| {
        let (c, chunk) = (j / chunks, j % chunks);
        let e = chosen[c];
        let rows = chunk * ROWS_PER_JOB..((chunk + 1) * ROWS_PER_JOB).min(n);
        let targets = &sent[e];
        // SAFETY: output row `targets[i].0` went to expert e alone, and
        // job j alone writes its columns `rows`; y holds ids × n values.
        let write = |i: usize, r: usize, v: f32| unsafe { out.write(targets[i].0 * n + r, v) };
        products(w, (e * n, rows), (&inputs[c], &groups[c]), simd, &write);
    };
    parallel(chosen.len() * chunks, &job);
    Ok(())
}
